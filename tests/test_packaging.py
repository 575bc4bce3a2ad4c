"""A release as a user gets it (issue 21, item 9): build the sdist and, from it, the wheel; install
the wheel into a fresh virtual environment (no checkout on its path); run the README's quick start
there. A failed build fails this test: it never skips."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sql_lease.sql.migrate import HEAD_REVISION

REPO = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.mark.slow
def test_the_wheel_built_from_the_sdist_runs_the_quick_start_in_a_fresh_venv(tmp_path: Path) -> None:
    started = time.monotonic()
    dist = tmp_path / "dist"
    # sdist first, then the wheel from the unpacked sdist (python -m build's default): a file the
    # sdist forgets breaks the wheel here, not at a user's
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO)], tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = dist.glob("sql_lease-*.tar.gz")
    (wheel,) = dist.glob("sql_lease-*.whl")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(name.endswith("/migrations/env.py") for name in names), names
    assert any(name.endswith("/README.md") for name in names)

    venv = tmp_path / "fresh"
    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQL_LEASE_", "PYTHON", "VIRTUAL_ENV"))}
    env["HOME"] = str(tmp_path)  # no config file of the machine's user
    env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))  # the warm cache, not tmp's
    installed = _run(
        [str(venv / "bin/pip"), "install", "--disable-pip-version-check", "--quiet", str(wheel)], tmp_path, 300, env=env
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = _run([str(venv / "bin/python"), "-c", "import sql_lease; print(sql_lease.__file__)"], tmp_path, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the installed copy, not the checkout

    cli = str(venv / "bin/sql-lease")
    work = tmp_path / "work"
    work.mkdir()
    migrated = _run([cli, "migrate"], work, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert f"created sql_leases at revision {HEAD_REVISION}" in migrated.stdout
    assert str(work / "sql_lease.db") in migrated.stderr  # the local default is said
    # the quick start: one exec runs, a second one at the same time is refused with 75
    go = work / "go"
    first = subprocess.Popen(
        [cli, "exec", "nightly", "--", "sh", "-c", f'echo "running, fence $SQL_LEASE_FENCE"; touch started; '
         f"while [ ! -e {go} ]; do sleep 0.05; done"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (work / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = _run([cli, "exec", "nightly", "--", "echo", "never"], work, env=env)
        assert second.returncode == 75, second.stderr
        assert "never" not in second.stdout and "not acquired: held by" in second.stderr
        go.touch()
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0, err
        assert out == "running, fence 1\n"
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert time.monotonic() - started < 240  # the budget is ~90 s; a loaded machine gets slack
