#!/usr/bin/env bash
# Create .venv and install the project with its dev extras at the versions the suite last passed with
# (constraints.txt). `AOT_LATEST=1 bash scripts/setup.sh` installs the newest releases instead, to try the suite on
# them. torch comes first, at the version constraints.txt names in both cases (the CPU build), so that no other
# requirement pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
install=(.venv/bin/python -m pip install --quiet)
torch=$(grep '^torch==' constraints.txt)
if [ "${AOT_LATEST:-0}" = 1 ]; then
    "${install[@]}" --upgrade pip
    "${install[@]}" "$torch"
    "${install[@]}" --upgrade --upgrade-strategy eager -e ".[dev]" "$torch"
else
    if ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "setup.sh: constraints.txt pins versions tested on Python 3.11+; AOT_LATEST=1 takes the newest releases" >&2
        exit 1
    fi
    "${install[@]}" --constraint constraints.txt pip
    "${install[@]}" --constraint constraints.txt "$torch"
    "${install[@]}" --constraint constraints.txt -e ".[dev]"
fi
