"""Settings of the example project: PostgreSQL from ``DATABASE_URL``, one request = one transaction."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["DATABASE_URL"])  # postgresql://user:password@host:5432/dbname
if _url.scheme not in ("postgres", "postgresql") and not _url.scheme.startswith("postgresql+"):
    raise RuntimeError(f"DATABASE_URL must be a postgresql:// URL, not {_url.scheme}://")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "leasesite.urls"
INSTALLED_APPS = ["reports"]
INSTALLED_APPS += ["sql_lease.django"]  # manage.py migrate creates the lease table
MIDDLEWARE: list[str] = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 (or psycopg2 if that is what you have)
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": _url.port or "",
        # Every request runs in one transaction, rolled back if the view raises. The lease
        # statements are not part of it: the provider has connections of its own.
        "ATOMIC_REQUESTS": True,
        "OPTIONS": {"options": f"-c search_path={os.environ['DJANGO_DB_SCHEMA']}"}
        if os.environ.get("DJANGO_DB_SCHEMA")
        else {},
    }
}
