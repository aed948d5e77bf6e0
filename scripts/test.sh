#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not e2e"` for the fast tier (no Ray, engine server or training run),
# `-m "not slow"` without the minutes-long runs, `--soak` to add the soak tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OMP_WAIT_POLICY=PASSIVE
exec .venv/bin/python -m pytest -q "$@"
