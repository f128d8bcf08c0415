#!/usr/bin/env bash
# Set up (idempotent) and run the test suite; the 25 slowest tests are listed at the end. Extra arguments go to
# pytest. `AOT_LATEST=1 bash scripts/test.sh` runs it on the newest releases instead of constraints.txt's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q --durations=25 "$@"
