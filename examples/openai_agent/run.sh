#!/usr/bin/env bash
# OpenAI-SDK calculator agent, trained unmodified on CPU: a short SFT warm start that shows the
# model the tool-call format (stopped while it copies the operands only part of the time), then
# GRPO through the agent adapter (the agent is agent.py).
# Usage (from anywhere): bash examples/openai_agent/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

MODEL=${SLIME_AGENT_MODEL:-.cache/examples/openai_agent/model-calltokens}   # 0.8M parameters
DATA=${SLIME_AGENT_DATA:-.cache/examples/openai_agent/data}
RUN_DIR=${RUN_DIR:-runs/examples/openai_agent-$(date +%Y%m%d-%H%M%S)}
SFT_STEPS=${SFT_STEPS:-175}
RL_STEPS=${RL_STEPS:-40}
RL_LR=${RL_LR:-3e-4}

# the tiny model, its tokenizer with the call's fixed JSON as two added tokens (make_model.py)
[ -f "$MODEL/config.json" ] || .venv/bin/python -m examples.openai_agent.make_model --out "$MODEL"
[ -f "$DATA/sft_tools.jsonl" ] || .venv/bin/python -m examples.openai_agent.make_data --out "$DATA"

OPT=(--adam-beta2 0.999 --clip-grad 1.0 --lr-decay-style constant --weight-decay 0.0 --colocate)

# 1. warm start: the tool-call format (user -> <tool_call>...</tool_call> -> tool -> \boxed{}),
#    stopped early on purpose: at ~175 steps the greedy agent copies the operands about half the time
.venv/bin/slime train --hf-checkpoint "$MODEL" \
  --prompt-data "$DATA/sft_tools.jsonl" --input-key messages --rollout-shuffle \
  --rollout-function-path slime.rollout.sft_rollout.generate_rollout --loss-type sft_loss \
  --num-rollout "$SFT_STEPS" --rollout-batch-size 32 --global-batch-size 32 --micro-batch-size 32 \
  --lr 3e-3 "${OPT[@]}" --save "$RUN_DIR/sft" --run-dir "$RUN_DIR/sft-run"

# 2. GRPO on the agent: every sample is one agent run through the OpenAI adapter (128 runs per
#    rollout, two optimizer steps on them; a fresh optimizer, so the lr warms up over 10 steps)
.venv/bin/slime train --hf-checkpoint "$RUN_DIR/sft/iter_$(printf %07d $((SFT_STEPS - 1)))" \
  --prompt-data "$DATA/train.jsonl" --input-key prompt --label-key label --rollout-shuffle --rm-type math \
  --custom-generate-function-path slime.agent.generate.generate \
  --agent-function-path examples.openai_agent.agent.run \
  --sglang-tool-call-parser qwen25 --max-turns 3 --max-total-tokens 128 \
  --num-rollout "$RL_STEPS" --rollout-batch-size 16 --n-samples-per-prompt 8 \
  --rollout-max-response-len 32 --rollout-temperature 0.7 \
  --global-batch-size 64 --micro-batch-size 64 --advantage-estimator grpo --eps-clip 0.2 \
  --lr "$RL_LR" --lr-warmup-iters 10 "${OPT[@]}" \
  --eval-interval 10 --eval-prompt-data arith "$DATA/eval.jsonl" --eval-input-key prompt --eval-label-key label \
  --eval-temperature 0 --n-samples-per-eval-prompt 1 \
  --run-dir "$RUN_DIR/rl"

echo "metrics: $RUN_DIR/rl/metrics.jsonl"
.venv/bin/python - "$RUN_DIR/rl/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    print({k: row[k] for k in ("rollout_id", "rollout/raw_reward", "eval/arith") if k in row})
PY
