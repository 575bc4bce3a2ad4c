"""Types a user's editor can use (issue 21, item 8): ``mypy --strict`` on a file that uses the
public API as the README does (tests/typing/example_usage.py) finds nothing, and on a file of
misuses (tests/typing/bad_usage.py) finds exactly the errors its ``# E: <code>`` comments mark."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "tests" / "typing"
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*?)  \[(?P<code>[a-z-]+)\]$")


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on one file, with the project's configuration (pyproject.toml)."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-pretty", "--show-error-codes", str(path.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _errors(output: str) -> set[tuple[int, str]]:
    found = set()
    for line in output.splitlines():
        if match := ERROR.match(line):
            found.add((int(match["line"]), match["code"]))
    return found


@pytest.mark.slow
def test_the_readme_usage_type_checks_with_the_inferred_types() -> None:
    checked = _mypy(EXAMPLES / "example_usage.py")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success" in checked.stdout


@pytest.mark.slow
def test_misuses_of_the_public_api_are_type_errors() -> None:
    path = EXAMPLES / "bad_usage.py"
    expected = {
        (number, match[1])
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if (match := re.search(r"# E: ([a-z-]+)$", text))
    }
    checked = _mypy(path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert _errors(checked.stdout) == expected, checked.stdout


def test_the_example_file_imports() -> None:
    """The typed example is real code: it imports (nothing in it touches a database)."""
    spec = importlib.util.spec_from_file_location("sql_lease_example_usage", EXAMPLES / "example_usage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.use_decorated_sync)
