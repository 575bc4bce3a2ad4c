"""The documentation is built and its examples run.

``mkdocs build --strict`` must succeed (a broken link, a missing page or an unresolved API
reference fails it), and every fenced code block of README.md and docs/*.md in a language below
runs here, so no snippet can rot:

- ``python``: executed as ``__main__`` in a temporary directory, with ``DATABASE_URL`` set to a
  fresh SQLite file (or the test PostgreSQL with the marker ``postgres``). Top-level ``await``
  is allowed: the block then runs in ``asyncio.run``.
- ``sh``: run with bash in a temporary directory (where the CLI's default ``./sql_lease.db``
  lands), ``sql-lease`` on ``PATH``, ``DATABASE_URL`` naming a fresh SQLite file (or the test
  PostgreSQL); it must exit 0.
- ``toml``: parsed.
- ``sql``: must be marked ``skip`` naming the test that runs it.

A block's behaviour is set by an HTML comment on the line right before its fence (invisible on
GitHub and on the site)::

    <!-- example: KIND [prelude=NAME] [expect="TEXT"] [reason="WHY"] -->

KIND is ``run`` (the default), ``postgres`` (run against ``SQL_LEASE_TEST_POSTGRES_URL``: the
test server), ``mysql`` (``DATABASE_URL`` names a database of its own on the test MySQL/MariaDB),
``import`` (compiled, and its absolute imports executed against the real packages: for framework
code that needs a server process or a project around it), ``skip`` (not run;
``reason`` required: an install command, an illustration). ``prelude=async`` / ``prelude=sync``
wraps the block in a provider ``leases`` on ``DATABASE_URL`` (migrated, closed afterwards), so
a page can show a fragment; the page's text says what ``leases`` is. ``expect`` is text the
block's output must contain.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"python", "sh", "toml"}
CHECKED_LANGS = RUN_LANGS | {"py", "bash", "shell", "console", "pycon"}  # these must use a RUN_LANGS name
KINDS = {"run", "postgres", "mysql", "import", "skip"}
MARKER = re.compile(r"^<!--\s*example:\s*(?P<body>.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")

PRELUDES = {
    "async": (
        "import os\nfrom sql_lease import SqlLeaseProvider\n"
        'leases = SqlLeaseProvider(os.environ["DATABASE_URL"])\nawait leases.migrate()\n',
        "await leases.close()",
    ),
    "sync": (
        "import os\nfrom sql_lease import SyncSqlLeaseProvider\n"
        'leases = SyncSqlLeaseProvider(os.environ["DATABASE_URL"])\nleases.migrate()\n',
        "leases.close()",
    ),
}


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    kind: str = "run"
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_marker(body: str, where: str) -> tuple[str, dict[str, str]]:
    words = shlex.split(body)
    if not words or words[0] not in KINDS:
        raise ValueError(f"{where}: example marker must start with one of {sorted(KINDS)}: {body!r}")
    options: dict[str, str] = {}
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if not sep or name not in {"prelude", "expect", "reason"}:
            raise ValueError(f"{where}: unknown example option {word!r}")
        options[name] = value
    if words[0] == "skip" and not options.get("reason"):
        raise ValueError(f"{where}: a skipped example needs reason=...")
    if options.get("prelude", "async") not in PRELUDES:
        raise ValueError(f"{where}: unknown prelude {options['prelude']!r}")
    return words[0], options


def collect(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = len(match["indent"]), match["fence"], match["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        where = f"{path.relative_to(ROOT)}:{start + 1}"
        if lang not in CHECKED_LANGS | {"sql"}:
            continue
        if lang not in RUN_LANGS | {"sql"}:
            raise ValueError(f"{where}: use ```python, ```sh or ```toml, not ```{lang}")
        kind, options = "run", {}
        previous = lines[start - 1].strip() if start else ""
        if marker := MARKER.match(previous):
            kind, options = parse_marker(marker["body"], where)
        if lang == "sql" and kind != "skip":
            raise ValueError(f"{where}: a ```sql block is not run here: mark it skip with the test that runs it")
        yield Block(path, start + 1, lang, "\n".join(body) + "\n", kind, options)


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in collect(path)]


BLOCKS = all_blocks()


def unique(blocks: list[Block]) -> list[Block]:
    """One of each: a block repeated word for word (the README's quick start on its page) runs once."""
    seen: dict[tuple[str, str, str, str], Block] = {}
    for block in blocks:
        seen.setdefault((block.lang, block.kind, repr(sorted(block.options.items())), block.source), block)
    return list(seen.values())


def test_examples_are_found() -> None:
    """The collector sees the README's and the pages' examples (a parsing slip would skip them all)."""
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert sum(b.lang == "python" for b in readme) >= 3
    assert sum(b.lang == "python" and b.kind != "skip" for b in BLOCKS) >= 30


def test_skipped_examples_are_rare() -> None:
    """Only install commands and the odd illustration are not run; each says why."""
    skipped = [b for b in BLOCKS if b.kind == "skip"]
    assert len(skipped) <= 20, [b.id for b in skipped]


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQL_LEASE_")}  # the CLI's default: ./sql_lease.db
    env["DATABASE_URL"] = url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no user config file is read
    return env


def _python_source(block: Block) -> str:
    prelude = block.options.get("prelude")
    if not prelude:
        return block.source
    before, after = PRELUDES[prelude]
    return f"{before}try:\n{textwrap.indent(block.source, '    ')}\nfinally:\n    {after}\n"


def _run_python(block: Block, tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    for name, value in _env(tmp_path, url).items():
        monkeypatch.setenv(name, value)
    code = compile(_python_source(block), block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": "__main__", "__file__": str(tmp_path / "example.py")}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    return out.getvalue()


def _check_imports(block: Block) -> None:
    tree = ast.parse(block.source, block.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and not (isinstance(node, ast.ImportFrom) and node.level):
            exec(compile(ast.Module([node], []), block.id, "exec"), {})


@pytest.fixture(scope="session")
def docs_pg_url(pg_url: str) -> str:
    """The test PostgreSQL (conftest's ``pg_url``: no server is a failure, never a skip), its
    default lease table migrated, as the pages assume after their quick start's ``migrate``."""
    from sql_lease import SyncSqlLeaseProvider

    with SyncSqlLeaseProvider(pg_url) as leases:
        leases.migrate()
    return pg_url


@pytest.fixture(scope="session")
def docs_mysql_url(mysql_db: tuple[str, str]) -> str:
    """A URL naming the session's migrated database on the test MySQL/MariaDB (conftest's
    ``mysql_db``: no server is a failure, never a skip)."""
    import sqlalchemy as sa

    url, database = mysql_db
    return sa.make_url(url).set(database=database).render_as_string(hide_password=False)


@pytest.mark.parametrize("block", unique([b for b in BLOCKS if b.kind != "skip"]), ids=lambda b: b.id)
def test_example(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    if block.kind in ("postgres", "mysql"):
        url = request.getfixturevalue(f"docs_{'pg' if block.kind == 'postgres' else block.kind}_url")
    if block.lang == "toml":
        tomllib.loads(block.source)
        return
    if block.lang == "sh":
        proc = subprocess.run(
            ["bash", "-c", block.source],
            cwd=tmp_path,
            env=_env(tmp_path, url),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        output = proc.stdout + proc.stderr
    elif block.kind == "import":
        _check_imports(block)
        compile(block.source, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return
    else:
        output = _run_python(block, tmp_path, url, monkeypatch)
    if "expect" in block.options:
        assert block.options["expect"] in output, f"{block.id}: {block.options['expect']!r} not in:\n{output}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """The site builds in strict mode: a broken link, nav entry or API reference fails it."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_links_resolve() -> None:
    """The README is not built by MkDocs: its links into docs/ and the repository are checked here,
    anchors included (GitHub and MkDocs make the same ids for these headings)."""
    from markdown.extensions.toc import slugify

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 10
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        path = ROOT / target
        assert path.exists(), f"README links to a missing {target}"
        if anchor:
            headings = re.findall(r"^#+\s+(.*)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"README links to a missing anchor {target}#{anchor}"


def test_readme_fits() -> None:
    """The README is a front page: what, why, install, quick start, one example per audience, links."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250
