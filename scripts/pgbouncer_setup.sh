#!/usr/bin/env bash
# Make sure PgBouncer is installed (Debian's package), for tests/test_pgbouncer.py.
# Prints the path of the pgbouncer binary; exits non-zero with a message if it cannot be installed.
set -euo pipefail

find_pgbouncer() {
    command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; } || true
}

found=$(find_pgbouncer)
if [ -z "$found" ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "pgbouncer_setup.sh: pgbouncer is missing; install it (Debian: apt-get install pgbouncer) as root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q pgbouncer >&2 || { apt-get update -q >&2 && apt-get install -y -q pgbouncer >&2; }
    # Debian's package starts nothing here (no systemd); the tests run their own instance.
    found=$(find_pgbouncer)
fi
if [ -z "$found" ]; then
    echo "pgbouncer_setup.sh: installing pgbouncer did not provide a pgbouncer binary" >&2
    exit 1
fi
echo "$found"
