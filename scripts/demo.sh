#!/usr/bin/env bash
# Set up (idempotent) and run the main job: `aot demo` trains, evaluates, exports and reloads two tiny AoT models
# on data that ships with Python and scikit-learn (no download). Extra arguments go to `aot demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/aot demo "$@"
