"""Running worker scripts as real OS processes, all at once, for the multi-process tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_scripts(
    script: str | Path, argvs: Sequence[Sequence[str]], cwd: Path, timeout_s: float
) -> list[tuple[int, str, str]]:
    """Run ``script`` once per argument list, all at once; (exit code, stdout, stderr) of each.

    Every process is waited for (and killed if it overruns) before this returns, so a failing
    test never leaves a process or an unclosed pipe behind."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv in argvs
    ]
    deadline = time.monotonic() + timeout_s
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed after {timeout_s} s)"
        results.append((proc.returncode, out, err))
    return results


def json_summaries(results: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """The JSON summary each worker printed last; every worker must have exited 0."""
    summaries = []
    for code, out, err in results:
        assert code == 0, err
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return summaries
