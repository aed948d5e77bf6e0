#!/usr/bin/env bash
# LLM-as-judge example on CPU: the policy `actor` and a frozen `judge` (the same tiny checkpoint),
# each with its own engine, 3 rollouts of GRPO rewarded by the judge.
# Usage (from anywhere): bash examples/llm_judge/run.sh [extra slime train arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

WORK=${WORK:-/tmp/slime-examples}
MODEL=${SLIME_TINY_MODEL:-$WORK/tiny}
[ -f "$MODEL/config.json" ] || .venv/bin/slime tiny-model --out "$MODEL"
[ -f "$WORK/data/train.jsonl" ] || .venv/bin/slime make-data --out "$WORK/data" --difficulty 2

.venv/bin/slime train \
  --hf-checkpoint "$MODEL" \
  --prompt-data "$WORK/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
  --sglang-config examples/llm_judge/sglang_config.yaml --rollout-num-gpus 2 \
  --custom-rm-path examples.llm_judge.reward.judge_reward \
  --num-rollout 3 --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 8 \
  --global-batch-size 16 --micro-batch-size 16 --lr 1e-3 --colocate \
  --run-dir "$WORK/runs/llm_judge" "$@"
