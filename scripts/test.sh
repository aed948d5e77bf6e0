#!/usr/bin/env bash
# Set up (if needed), run the checks (ruff, codespell, mypy: .pre-commit-config.yaml), then the
# test suite in two passes: the fast tier (no Ray, engine server or training run) on up to 4 cores
# at once (pytest-xdist, one test file per worker), then the e2e tier in one process (its runs
# use every core themselves, and two at once would oversubscribe them). Arguments replace that
# plan by one pytest call with them, e.g. `bash scripts/test.sh -m "not e2e" -n 2` for the fast
# tier, `-m "not slow"` without the minutes-long runs, `--soak` to add the soak tests.
# SLIME_SKIP_CHECKS=1 skips the checks (the edit loop); CI always runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OMP_WAIT_POLICY=PASSIVE
if [ "${SLIME_SKIP_CHECKS:-0}" != 1 ] || [ "${CI:-}" = true ]; then
  # The hooks are local (language: system): the tools come from .venv, at constraints.txt's versions.
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/pre-commit run --all-files --show-diff-on-failure
fi
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
workers=$(nproc)
[ "$workers" -gt 4 ] && workers=4
.venv/bin/python -m pytest -q -m "not e2e" -n "$workers" --dist loadfile
exec .venv/bin/python -m pytest -q -m e2e
