#!/usr/bin/env bash
# The multi-agent example end to end on CPU: set up, build the tiny model and the addition task
# (once, into $WORK), then a short GRPO run whose rollouts are solver -> reviewer -> finalizer teams.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
WORK=${WORK:-${TMPDIR:-/tmp}/slime-examples}
RUN_DIR=${RUN_DIR:-$WORK/runs/multi_agent-$(date +%Y%m%d-%H%M%S)}
[ -f "$WORK/tiny/config.json" ] || .venv/bin/slime tiny-model --out "$WORK/tiny"
[ -f "$WORK/data/train.jsonl" ] || .venv/bin/slime make-data --out "$WORK/data" --difficulty 2

# 6 groups per rollout = 2 prompts x 3 agents; each group holds one agent's turns of 4 team runs.
# No --apply-chat-template: every agent renders its own context with the chat template.
.venv/bin/slime train \
  --hf-checkpoint "$WORK/tiny" \
  --prompt-data "$WORK/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
  --rm-type math \
  --rollout-function-path examples.multi_agent.rollout.generate_rollout \
  --num-rollout 4 --rollout-batch-size 6 --n-samples-per-prompt 4 --rollout-max-response-len 8 \
  --global-batch-size 24 --micro-batch-size 24 --advantage-estimator grpo --lr 1e-3 --colocate \
  --eval-prompt-data arith "$WORK/data/eval.jsonl" --eval-temperature 0 --eval-interval 4 \
  --run-dir "$RUN_DIR" "$@"

.venv/bin/python - "$RUN_DIR/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
p = "rollout/multi_agent"
print("rollout  samples  team_reward  solver_own  " + "  ".join(f"{r}_len" for r in ("solver", "reviewer", "finalizer")))
for r in rows:
    if f"{p}/team_reward" in r:
        print(f"{r['rollout_id']:>7}  {r['rollout/num_samples']:>7.0f}  {r[f'{p}/team_reward']:>11.3f}  "
              f"{r[f'{p}/solver_own_reward']:>10.3f}  " + "  ".join(f"{r[f'{p}/{x}_response_len']:>{len(x) + 4}.1f}"
              for x in ("solver", "reviewer", "finalizer")))
print("eval/arith (solver alone):", [round(r["eval/arith"], 3) for r in rows if "eval/arith" in r])
print("metrics:", sys.argv[1])
PY
