#!/usr/bin/env bash
# Coding-agent example, end to end on CPU in under a minute: build the tiny model (cached), run
# 3 rollouts of GRPO with the sandboxed-tool hook and test-based rewards.
# Usage (from anywhere): bash examples/coding_agent/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

MODEL=${SLIME_TINY_MODEL:-.cache/examples/tiny-model}
RUN_DIR=${RUN_DIR:-runs/examples/coding_agent-$(date +%Y%m%d-%H%M%S)}

[ -f "$MODEL/config.json" ] || .venv/bin/slime tiny-model --out "$MODEL"

.venv/bin/slime train \
  --hf-checkpoint "$MODEL" \
  --prompt-data examples/coding_agent/data.jsonl --input-key prompt --label-key label --apply-chat-template \
  --custom-generate-function-path examples.coding_agent.generate.generate \
  --custom-rm-path examples.coding_agent.reward.reward \
  --sandbox-timeout 5 --sandbox-cpu-time 3 --sandbox-memory-mb 512 --sandbox-concurrency 2 \
  --num-rollout 3 --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 96 \
  --global-batch-size 16 --micro-batch-size 4 --colocate \
  --run-dir "$RUN_DIR"

echo "metrics: $RUN_DIR/metrics.jsonl"
tail -n 1 "$RUN_DIR/metrics.jsonl" | .venv/bin/python -c '
import json, sys
row = json.loads(sys.stdin.read())
print({k: row[k] for k in ("rollout_id", "rollout/raw_reward", "rollout/response_len/mean", "rollout/status/failed", "train/pg_loss")})'
