#!/usr/bin/env bash
# The GPU check: trainer steps, the built-in engine and a CUDA-IPC weight update on
# one CUDA GPU, in under 8 minutes, ending with one summary table (scripts/gpu_check.py says what
# each check does). Run from anywhere:
#
#   bash scripts/gpu_check.sh --dry-run          # no GPU: check the arguments, print the plan
#   bash scripts/gpu_check.sh                    # on a GPU machine (table also in $OUT or ./gpu_check_out)
#   bash scripts/gpu_check.sh --download-wheels  # here, with pip: the engine's web stack as wheels in .whl/
#
# The GPU machine has torch, transformers and httpx but not the engine server's web stack
# (fastapi, uvicorn, pydantic): --download-wheels fetches those (the versions constraints.txt pins,
# for CPython 3.12 on x86-64) into .whl/, which a device run carries and installs under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."

# fastapi imports opentelemetry-api; pydantic needs typing_extensions >= 4.16 (newer than some images')
WHEELS=(fastapi starlette pydantic pydantic_core annotated-types typing-inspection uvicorn opentelemetry-api
        typing_extensions)

if [[ "${1:-}" == "--download-wheels" ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    specs=()
    for name in "${WHEELS[@]}"; do
        pin=$(grep -i -E "^${name//[-_]/[-_]}==" constraints.txt || true)
        [[ -n "$pin" ]] || { echo "gpu_check.sh: no pin for $name in constraints.txt" >&2; exit 2; }
        specs+=("$pin")
    done
    py=python3; [[ -x .venv/bin/python ]] && py=.venv/bin/python
    exec "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "${specs[@]}"
fi

dry=0
for arg in "$@"; do [[ "$arg" == "--dry-run" ]] && dry=1; done
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
# the carried wheels, where the web stack is missing (the GPU machine); a machine that has it uses its own
if [[ $dry == 0 ]] && compgen -G ".whl/*.whl" > /dev/null \
        && ! "$py" -c "import fastapi, uvicorn, pydantic" > /dev/null 2>&1; then
    site=/tmp/gpu_check_site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
# the script stops itself at --time-limit-s (480 s by default); this is the backstop
exec timeout 530 "$py" scripts/gpu_check.py "$@"
