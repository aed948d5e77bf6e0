"""slime-style launch argument lists, written for this repository in the shape of slime's
scripts/run-*.sh: a Megatron model-config block, then CKPT / ROLLOUT / EVAL / PERF / GRPO /
OPTIMIZER / SGLANG / MISC argument groups. Paths point where a slime user's would (/root/...);
`with_paths` swaps them for local ones."""

from __future__ import annotations

# A dense model with grouped-query attention and query/key norms (the shape of a 4B Qwen3).
QWEN3_4B_MODEL = [
    "--swiglu",
    "--num-layers",
    "36",
    "--hidden-size",
    "2560",
    "--ffn-hidden-size",
    "9728",
    "--num-attention-heads",
    "32",
    "--group-query-attention",
    "--num-query-groups",
    "8",
    "--use-rotary-position-embeddings",
    "--disable-bias-linear",
    "--normalization",
    "RMSNorm",
    "--norm-epsilon",
    "1e-6",
    "--rotary-base",
    "1000000",
    "--vocab-size",
    "151936",
    "--kv-channels",
    "128",
    "--qk-layernorm",
]
# A mixture-of-experts model (the shape of a 30B-A3B Qwen3).
QWEN3_MOE_MODEL = [
    "--swiglu",
    "--num-layers",
    "48",
    "--hidden-size",
    "2048",
    "--ffn-hidden-size",
    "6144",
    "--num-attention-heads",
    "32",
    "--group-query-attention",
    "--num-query-groups",
    "4",
    "--kv-channels",
    "128",
    "--use-rotary-position-embeddings",
    "--disable-bias-linear",
    "--normalization",
    "RMSNorm",
    "--norm-epsilon",
    "1e-6",
    "--rotary-base",
    "1000000",
    "--vocab-size",
    "151936",
    "--qk-layernorm",
    "--untie-embeddings-and-output-weights",
    "--moe-ffn-hidden-size",
    "768",
    "--moe-router-score-function",
    "softmax",
    "--moe-token-dispatcher-type",
    "alltoall",
    "--moe-router-topk",
    "8",
    "--moe-layer-freq",
    "[1]*48",
    "--num-experts",
    "128",
    "--moe-grouped-gemm",
    "--moe-aux-loss-coeff",
    "0",
]
# The bundled tiny model's shape (slime.data.tiny_model), for a run that must train here.
TINY_MODEL = [
    "--swiglu",
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--ffn-hidden-size",
    "192",
    "--num-attention-heads",
    "4",
    "--group-query-attention",
    "--num-query-groups",
    "2",
    "--kv-channels",
    "16",
    "--use-rotary-position-embeddings",
    "--normalization",
    "RMSNorm",
    "--norm-epsilon",
    "1e-6",
    "--rotary-base",
    "10000",
    "--vocab-size",
    "320",
    "--add-qkv-bias",
]

CKPT = [
    "--hf-checkpoint",
    "/root/Qwen3-4B",
    "--ref-load",
    "/root/Qwen3-4B_torch_dist",
    "--load",
    "/root/Qwen3-4B_slime/",
    "--save",
    "/root/Qwen3-4B_slime/",
    "--save-interval",
    "20",
]
ROLLOUT = [
    "--prompt-data",
    "/root/dapo-math-17k/dapo-math-17k.jsonl",
    "--input-key",
    "prompt",
    "--label-key",
    "label",
    "--apply-chat-template",
    "--rollout-shuffle",
    "--rm-type",
    "deepscaler",
    "--num-rollout",
    "3000",
    "--rollout-batch-size",
    "32",
    "--n-samples-per-prompt",
    "8",
    "--rollout-max-response-len",
    "8192",
    "--rollout-temperature",
    "1",
    "--global-batch-size",
    "256",
    "--balance-data",
]
EVAL = [
    "--eval-interval",
    "20",
    "--eval-prompt-data",
    "aime",
    "/root/aime-2024/aime-2024.jsonl",
    "--n-samples-per-eval-prompt",
    "16",
    "--eval-max-response-len",
    "16384",
    "--eval-top-p",
    "1",
]
PERF = [
    "--tensor-model-parallel-size",
    "2",
    "--sequence-parallel",
    "--pipeline-model-parallel-size",
    "1",
    "--context-parallel-size",
    "1",
    "--expert-model-parallel-size",
    "1",
    "--expert-tensor-parallel-size",
    "1",
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "uniform",
    "--recompute-num-layers",
    "1",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu",
    "9216",
]
GRPO = [
    "--advantage-estimator",
    "grpo",
    "--use-kl-loss",
    "--kl-loss-coef",
    "0.00",
    "--kl-loss-type",
    "low_var_kl",
    "--entropy-coef",
    "0.00",
    "--eps-clip",
    "0.2",
    "--eps-clip-high",
    "0.28",
]
OPTIMIZER = [
    "--optimizer",
    "adam",
    "--lr",
    "1e-6",
    "--lr-decay-style",
    "constant",
    "--weight-decay",
    "0.1",
    "--adam-beta1",
    "0.9",
    "--adam-beta2",
    "0.98",
]
SGLANG = [
    "--rollout-num-gpus-per-engine",
    "2",
    "--sglang-mem-fraction-static",
    "0.7",
    "--sglang-cuda-graph-bs",
    "1",
    "2",
    "4",
    "8",
    "16",
    "24",
    "32",
]
MISC = [
    "--attention-dropout",
    "0.0",
    "--hidden-dropout",
    "0.0",
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "flash",
]
CLUSTER = ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate"]

# MoE extras: expert parallelism, CPU-offloaded optimizer, DP attention in SGLang, router options
MOE_PERF = [
    "--tensor-model-parallel-size",
    "4",
    "--sequence-parallel",
    "--pipeline-model-parallel-size",
    "1",
    "--context-parallel-size",
    "1",
    "--expert-model-parallel-size",
    "8",
    "--expert-tensor-parallel-size",
    "1",
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "uniform",
    "--recompute-num-layers",
    "1",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu",
    "20480",
    "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
]
MOE_SGLANG = [
    "--rollout-num-gpus-per-engine",
    "8",
    "--sglang-mem-fraction-static",
    "0.5",
    "--sglang-enable-dp-attention",
    "--sglang-dp-size",
    "8",
    "--sglang-ep-size",
    "8",
    "--sglang-cuda-graph-bs",
    "1",
    "2",
    "4",
    "8",
    "--router-balance-abs-threshold",
    "0",
]

SCRIPTS = {
    "qwen3-4b": QWEN3_4B_MODEL + CKPT + ROLLOUT + EVAL + PERF + GRPO + OPTIMIZER + SGLANG + MISC + CLUSTER,
    "qwen3-30b-a3b": QWEN3_MOE_MODEL
    + CKPT
    + ROLLOUT
    + EVAL
    + MOE_PERF
    + GRPO
    + OPTIMIZER
    + MOE_SGLANG
    + MISC
    + CLUSTER,
}


def with_paths(argv: list[str], **paths: str) -> list[str]:
    """`argv` with the values of the named options replaced (`hf_checkpoint=...` -> --hf-checkpoint)."""
    out = list(argv)
    for key, value in paths.items():
        opt = "--" + key.replace("_", "-")
        i = out.index(opt)
        out[i + 1] = value
    return out
