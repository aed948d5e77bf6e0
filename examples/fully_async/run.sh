#!/usr/bin/env bash
# The fully asynchronous example end to end on CPU: set up, build the tiny model and the addition
# task (once, into $WORK), then a short GRPO run whose rollouts come from a background generator.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
WORK=${WORK:-${TMPDIR:-/tmp}/slime-examples}
RUN_DIR=${RUN_DIR:-$WORK/runs/fully_async-$(date +%Y%m%d-%H%M%S)}
[ -f "$WORK/tiny/config.json" ] || .venv/bin/slime tiny-model --out "$WORK/tiny"
[ -f "$WORK/data/train.jsonl" ] || .venv/bin/slime make-data --out "$WORK/data" --difficulty 2

# At most 16 groups queued or generating (back-pressure); 8 groups per rollout.
export SLIME_FULLY_ASYNC_QUEUE_SIZE=${SLIME_FULLY_ASYNC_QUEUE_SIZE:-16}
# No --colocate: the engine and the trainer are separate processes with one core each, so the
# engine keeps generating while the trainer trains.
.venv/bin/slime train \
  --hf-checkpoint "$WORK/tiny" \
  --prompt-data "$WORK/data/train.jsonl" --input-key prompt --label-key label \
  --apply-chat-template --rollout-shuffle --rm-type math \
  --rollout-function-path examples.fully_async.rollout.generate_rollout \
  --num-rollout 6 --rollout-batch-size 8 --n-samples-per-prompt 4 --rollout-max-response-len 8 \
  --global-batch-size 32 --micro-batch-size 32 --advantage-estimator grpo --lr 1e-3 \
  --train-num-threads 1 --sglang-num-threads 1 \
  --eval-prompt-data arith "$WORK/data/eval.jsonl" --eval-temperature 0 --eval-interval 6 \
  --run-dir "$RUN_DIR" "$@"

.venv/bin/python - "$RUN_DIR/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
p = "rollout/fully_async"
print("rollout  queued_at_request  staleness_mean  staleness_max  wait_s  generated_total  raw_reward")
for r in rows:
    if f"{p}/groups_from_queue" in r:
        print(f"{r['rollout_id']:>7}  {r[f'{p}/queue_size_at_request']:>17.0f}  {r[f'{p}/staleness_mean']:>14.2f}  "
              f"{r[f'{p}/staleness_max']:>13.0f}  {r[f'{p}/wait_time']:>6.2f}  {r[f'{p}/groups_generated_total']:>15.0f}"
              f"  {r['rollout/raw_reward']:>10.3f}")
print("metrics:", sys.argv[1])
PY
