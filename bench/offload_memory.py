"""--offload-train's memory, measured: a ~24M-parameter Qwen2 (random init, fp32) takes one AdamW
step, then its optimizer state is offloaded and onloaded as the trainer does between steps; the
process's RSS is read around each, and the state must come back bit for bit.

    .venv/bin/python bench/offload_memory.py [--hidden 512 --layers 8]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from slime.backends.torch.offload import TrainOffload, rss_bytes
from slime.runtime.threads import configure_torch_threads


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    configure_torch_threads(a.threads)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (4, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    n = sum(p.numel() for p in model.parameters())
    snapshot = {id(v): v.clone() for st in opt.state.values() for v in st.values()}
    with tempfile.TemporaryDirectory() as d:
        off = TrainOffload(d)
        stats = off.offload([opt], [model])
        before_onload = rss_bytes()
        back = off.onload()
        after_onload = rss_bytes()
    exact = all(torch.equal(snapshot[id(v)], v) for st in opt.state.values() for v in st.values())
    mib = 2**20
    print(f"model: {n / 1e6:.1f}M parameters (fp32); AdamW state {stats['offload_bytes'] / mib:.0f} MiB")
    print(
        f"offload: RSS {stats['rss_before'] / mib:.0f} -> {stats['rss_after'] / mib:.0f} MiB "
        f"(-{(stats['rss_before'] - stats['rss_after']) / mib:.0f} MiB) in {stats['offload_time'] * 1e3:.0f} ms"
    )
    print(
        f"onload:  RSS {before_onload / mib:.0f} -> {after_onload / mib:.0f} MiB in {back['onload_time'] * 1e3:.0f} ms; "
        f"bit-identical: {exact}"
    )


if __name__ == "__main__":
    main()
