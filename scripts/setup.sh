#!/usr/bin/env bash
# Create .venv and install slime-rl with its test and router extras (CPU torch pinned).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Every pip call takes constraints.txt: an unpinned torch would pull a multi-GB CUDA build.
# Re-run whenever pyproject.toml changed since the last install (a stamp file remembers it).
stamp=.venv/.slime-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
  .venv/bin/pip install -q --upgrade pip -c constraints.txt
  .venv/bin/pip install -q -c constraints.txt -e ".[test,router]"
  cp pyproject.toml "$stamp"
fi
# PyPI's torchvision/torchaudio are CUDA builds that break CPU torch imports.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
