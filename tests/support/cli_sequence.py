"""Run several ``sql-lease`` commands in one fresh Python process, some modules hidden as if not
installed: ``python tests/support/cli_sequence.py HIDDEN_MODULES_JSON COMMANDS_JSON`` prints a JSON
list of [exit code, stdout, stderr], one per command (tests/support/cli.py's ``invoke``, in the working
directory). A fresh process per command costs a second of start-up; one per driver set does."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    for hidden in json.loads(sys.argv[1]):
        sys.modules[hidden] = None  # type: ignore[assignment]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.support.cli import invoke

    results = [invoke(args, Path(os.getcwd())) for args in json.loads(sys.argv[2])]
    print(json.dumps([[done.returncode, done.stdout, done.stderr] for done in results]))
