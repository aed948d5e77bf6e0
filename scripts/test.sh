#!/usr/bin/env bash
# Set up (if needed), run the checks (ruff, codespell, mypy: .pre-commit-config.yaml), then the
# test suite. Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not e2e"` for the fast
# tier (no Ray, engine server or training run), `-m "not slow"` without the minutes-long runs,
# `--soak` to add the soak tests. SLIME_SKIP_CHECKS=1 skips the checks (the edit loop); CI always
# runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OMP_WAIT_POLICY=PASSIVE
if [ "${SLIME_SKIP_CHECKS:-0}" != 1 ] || [ "${CI:-}" = true ]; then
  # The hooks are local (language: system): the tools come from .venv, at constraints.txt's versions.
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/pre-commit run --all-files --show-diff-on-failure
fi
exec .venv/bin/python -m pytest -q "$@"
