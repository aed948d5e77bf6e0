"""Benchmark: one forward per prompt (`--share-prompt-forward`) against one per sample.

    .venv/bin/python bench/shared_prompt.py [--calls 6] [--threads 1,2]

A GRPO micro-batch holds the n samples of each prompt. With `--share-prompt-forward` (the default
for padded micro-batches) each distinct prompt runs once and its keys and values serve all n
samples. This script times the training forward and backward of one micro-batch
(`MicroBatch.response_logits`, then a loss over the logits, then `backward`) both ways,
alternating call by call, for:

* the default job's tiny model after its shape (0.12M parameters), 32 prompts x 8 samples,
  8 response tokens (the default job's batch);
* the ~25M Qwen2-style model of `bench/vs_trl.py --model 25m`, 8 prompts x 8 samples, 32 response
  tokens.

Prompts are the addition task's chat-formatted prompts (7-8 tokens); response tokens are random,
most samples at the full length as an untrained model writes them. Before timing, the two ways'
logits are compared (they must agree to 1e-5). Both models are random-init: speed does not depend
on the weights.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = {
    "tiny (0.12M)": dict(prompts=32, samples=8, response=8, shape={}),
    "~25M": dict(
        prompts=8,
        samples=8,
        response=32,
        shape=dict(
            hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536
        ),
    ),
}


def batch(tokenizer, prompts: int, samples: int, response: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    data: dict = {"tokens": [], "response_lengths": [], "loss_masks": []}
    for _ in range(prompts):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{rng.randint(0, 99)}+{rng.randint(0, 9)}="}],
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for _ in range(samples):
            r = response if rng.random() < 0.9 else rng.randint(1, response)
            data["tokens"].append(prompt + [rng.randrange(3, tokenizer.vocab_size) for _ in range(r)])
            data["response_lengths"].append(r)
            data["loss_masks"].append([1] * r)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=6, help="timed calls of each way (alternating)")
    p.add_argument("--threads", default="1,2")
    a = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.backends.torch.batching import build_micro_batch
    from slime.data.tiny_model import build_tiny_model

    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start")
    print(
        "| model | batch | threads | tokens, one forward per sample | per prompt | s per call, per sample | "
        "per prompt | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in MODELS.items():
            path = build_tiny_model(Path(tmp) / name.split()[0], **cfg["shape"])
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
            tokenizer = AutoTokenizer.from_pretrained(path)
            data = batch(tokenizer, cfg["prompts"], cfg["samples"], cfg["response"])
            n = len(data["tokens"])
            shared = build_micro_batch(data, range(n), packed=False, share_prompts=True)
            plain = build_micro_batch(data, range(n), packed=False)
            with torch.no_grad():
                diff = (shared.response_logits(model) - plain.response_logits(model)).abs().max().item()
            assert diff < 1e-5, f"{name}: the two ways' logits differ by {diff}"
            tokens = sum(len(t) for t in data["tokens"])
            distinct = {tuple(t[: len(t) - r]) for t, r in zip(data["tokens"], data["response_lengths"], strict=True)}
            prompt_tokens = sum(len(t) - r for t, r in zip(data["tokens"], data["response_lengths"], strict=True))
            # per prompt: each distinct prompt once, and no response's last token
            shared_tokens = tokens - prompt_tokens + sum(len(d) for d in distinct) - n
            for threads in [int(t) for t in a.threads.split(",")]:
                torch.set_num_threads(threads)
                times: dict[str, list[float]] = {"plain": [], "shared": []}
                for i in range(a.calls + 1):
                    for key, mb in (("plain", plain), ("shared", shared)):
                        t0 = time.perf_counter()
                        model.zero_grad(set_to_none=True)
                        mb.response_logits(model).float().logsumexp(-1).mean().backward()
                        if i:  # the first call of each warms up
                            times[key].append(time.perf_counter() - t0)
                s_plain, s_shared = statistics.median(times["plain"]), statistics.median(times["shared"])
                print(
                    f"| {name} | {cfg['prompts']} x {cfg['samples']}, {cfg['response']} new tokens | {threads} | "
                    f"{tokens} | {shared_tokens} | {s_plain:.4f} | {s_shared:.4f} | {s_plain / s_shared:.2f}x |",
                    flush=True,
                )
    print("logits of the two ways agree to 1e-5 on both models (checked before timing)")


if __name__ == "__main__":
    main()
