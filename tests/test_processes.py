"""Mutual exclusion between real OS processes, on SQLite (one file) and PostgreSQL."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SqlLeaseProvider

WORKER = Path(__file__).with_name("support") / "exclusion_worker.py"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/shared.db"
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()
        return {"url": url, "schema": ""}
    url, schema = request.getfixturevalue("pg_schema")
    return {"url": url, "schema": schema}


@pytest.mark.slow
def test_processes_never_share_a_key(backend: dict[str, str], tmp_path: Path) -> None:
    workers, keys, duration = 6, 3, 3.0
    prefix = f"excl-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "sections.log"
    markers = tmp_path / "markers"
    markers.mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--url",
                backend["url"],
                "--schema",
                backend["schema"],
                "--prefix",
                prefix,
                "--keys",
                str(keys),
                "--duration",
                str(duration),
                "--dir",
                str(markers),
                "--log",
                str(log),
                "--worker",
                str(i),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    summaries: list[dict[str, Any]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=duration + 60)
        assert proc.returncode == 0, err
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    total = {k: sum(s[k] for s in summaries) for k in summaries[0]}
    print("totals", backend["url"].split(":")[0], total)
    assert total["violations"] == 0, total
    assert total["errors"] == 0, total  # SQLite: no "database is locked" ever surfaces
    assert total["acquired"] >= 50, total
    assert total["refused"] > 0, total  # the keys really were contended
    fences: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, fence, _owner = line.split(" ")
        fences[key].append(int(fence))
    assert len(fences) == keys
    for key, seq in fences.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (key, seq)
    assert sum(len(seq) for seq in fences.values()) == total["acquired"]
