#!/usr/bin/env bash
# Search-R1 example, end to end on CPU in about a minute: build the tiny model (cached), start the
# local retrieval server, run 3 rollouts of GRPO with the search hook, stop the server.
# Usage (from anywhere): bash examples/search_r1/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

MODEL=${SLIME_TINY_MODEL:-.cache/examples/tiny-model}
RUN_DIR=${RUN_DIR:-runs/examples/search_r1-$(date +%Y%m%d-%H%M%S)}
PORT=${PORT:-$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

[ -f "$MODEL/config.json" ] || .venv/bin/slime tiny-model --out "$MODEL"

.venv/bin/python -m examples.search_r1.retrieval_server --port "$PORT" &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true' EXIT
export SEARCH_R1_URL="http://127.0.0.1:$PORT"
.venv/bin/python - "$SEARCH_R1_URL" <<'PY'
import json, sys, time, urllib.request
for _ in range(100):  # up to 20 s
    try:
        with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as r:
            print("retrieval server:", json.loads(r.read()))
            break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit("the retrieval server did not come up")
PY

.venv/bin/slime train \
  --hf-checkpoint "$MODEL" \
  --prompt-data examples/search_r1/data.jsonl --input-key prompt --label-key label --apply-chat-template \
  --custom-generate-function-path examples.search_r1.generate.generate \
  --custom-rm-path examples.search_r1.reward.reward \
  --num-rollout 3 --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 96 \
  --global-batch-size 16 --micro-batch-size 4 --colocate \
  --run-dir "$RUN_DIR"

echo "metrics: $RUN_DIR/metrics.jsonl"
tail -n 1 "$RUN_DIR/metrics.jsonl" | .venv/bin/python -c '
import json, sys
row = json.loads(sys.stdin.read())
print({k: row[k] for k in ("rollout_id", "rollout/raw_reward", "rollout/response_len/mean", "rollout/status/failed", "train/pg_loss")})'
