#!/usr/bin/env bash
# Create .venv and install slime-rl with what running it needs (CPU torch pinned, the router,
# bubblewrap for the code sandbox). `--tests` adds what the tests and benchmarks need: the test
# extra, Chromium for the report's browser test and the TRL venv (scripts/test.sh passes it).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TESTS=0
[ "${1:-}" = --tests ] && TESTS=1
EXTRAS=router
[ "$TESTS" = 1 ] && EXTRAS=test,router
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Every pip call takes constraints.txt: an unpinned torch would pull a multi-GB CUDA build.
# Re-run whenever pyproject.toml or the extras changed since the last install (a stamp file
# remembers both; an install with the test extra also serves a plain setup).
stamp=.venv/.slime-installed
want=$(printf '%s\n' "extras: $EXTRAS"; cat pyproject.toml)
have_tests=$(printf '%s\n' "extras: test,router"; cat pyproject.toml)
if [ ! -f "$stamp" ] || { [ "$(cat "$stamp")" != "$want" ] && [ "$(cat "$stamp")" != "$have_tests" ]; }; then
  .venv/bin/pip install -q --upgrade pip -c constraints.txt
  .venv/bin/pip install -q -c constraints.txt -e ".[$EXTRAS]"
  printf '%s\n' "$want" > "$stamp"
fi
# PyPI's torchvision/torchaudio are CUDA builds that break CPU torch imports.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The code sandbox (--rm-type code, slime/sandbox/bwrap.py) runs programs
# under bubblewrap: install Debian's package when `bwrap` is missing.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (bwrap) for the code sandbox" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; } >&2 \
      || echo "setup: could not install bubblewrap; the code sandbox will be unavailable" >&2
  else
    echo "setup: bwrap (bubblewrap) is missing; the code sandbox needs it. Install it with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y bubblewrap" >&2
  fi
fi
[ "$TESTS" = 1 ] || exit 0
# The report test (tests/e2e/test_report_browser.py) opens `slime report`'s HTML in headless
# Chromium driven by selenium: install Debian's chromium + chromium-driver when they are missing.
if ! command -v chromedriver >/dev/null 2>&1 || ! { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium + chromium-driver for the report's browser test" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } >&2 \
      || echo "setup: could not install chromium; the report's browser test will be skipped" >&2
  else
    echo "setup: chromium / chromedriver are missing; the report's browser test needs them. Install with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y chromium chromium-driver" >&2
  fi
fi
# Hugging Face TRL, the peer of bench/vs_trl.py and tests/algorithms/test_vs_trl_consistency.py, lives in its own
# venv .venv-trl (torch pinned by constraints.txt; ~1.5 min, ~1.5 GB). SLIME_SKIP_TRL=1 skips it; a failure
# only leaves that test skipped.
if [ "${SLIME_SKIP_TRL:-0}" != 1 ] && ! .venv-trl/bin/python -c "import trl" >/dev/null 2>&1; then
  echo "setup: creating .venv-trl (TRL, for bench/vs_trl.py and its consistency test)" >&2
  .venv/bin/python bench/vs_trl.py --install-only >&2 \
    || { echo "setup: could not create .venv-trl; the TRL consistency test will be skipped" >&2; rm -rf .venv-trl; }
fi
