"""slime's eval options against a real engine: each --eval-config data set is generated with its
own sampling settings (checked against a greedy decode of the HF model, not the engine), and
--eval-max-context-len cuts each answer to the room its prompt leaves."""

from __future__ import annotations

import json

import pytest

from tests.engine.engine_test_utils import reference_greedy

PROMPTS_A = ["1+1=", "12+30=", "7+5="]
PROMPTS_B = ["what is two", "count: 1 2 3"]


@pytest.fixture
def make(tiny_model_dir, engine, tmp_path):
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS_A))
    b.write_text("".join(json.dumps({"question": p}) + "\n" for p in PROMPTS_B))
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)

    def build(*extra: str):
        GenerateState.reset()
        return parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--rollout-batch-size",
                "1",
                "--num-rollout",
                "1",
                "--custom-rm-path",
                "tests.e2e.hooks.digit_reward",
                "--sglang-router-ip",
                host,
                "--sglang-router-port",
                port,
                "--run-dir",
                str(tmp_path / "run"),
                *extra,
            ]
        )

    yield build, str(a), str(b), tmp_path
    GenerateState.reset()


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _responses(samples):
    return [s.tokens[len(s.tokens) - s.response_length :] for s in samples]


def test_each_config_data_set_uses_its_own_sampling(make, hf_model, tokenizer):
    from slime.rollout.sglang_rollout import eval_rollout_async
    from tests.engine.engine_test_utils import run_async

    build, a, b, tmp = make
    greedy = {p: reference_greedy(hf_model, _ids(tokenizer, p), 6) for p in PROMPTS_A + PROMPTS_B}
    assert not any(tokenizer.eos_token_id in g for g in greedy.values())  # the comparisons below need no EOS
    g0 = greedy[PROMPTS_A[0]]
    first = next((i for i in range(1, 6) if g0[i] not in g0[:i]), 0)
    stop = g0[first]  # a token the first prompt's greedy answer reaches after a few others, if it can
    cfg = tmp / "eval.yaml"
    cfg.write_text(f"""
eval:
  defaults: {{temperature: 0.0}}
  datasets:
    - {{name: short, path: {a}, input_key: prompt, max_response_len: 3, min_new_tokens: 3, n_samples_per_eval_prompt: 2}}
    - {{name: topk1, path: {b}, input_key: question, temperature: 1.0, top_k: 1, max_response_len: 5}}
    - {{name: stopper, path: {a}, input_key: prompt, max_response_len: 6, stop_token_ids: [{stop}]}}
""")
    # the command line's would differ everywhere: 8 tokens at temperature 1, top-k off
    args = build("--eval-config", str(cfg), "--eval-max-response-len", "8", "--eval-temperature", "1.0")
    results = run_async(eval_rollout_async(args, 0))

    short = results["short"]["samples"]
    assert _responses(short) == [greedy[p][:3] for p in PROMPTS_A for _ in range(2)]
    assert results["short"]["truncated"] == [True] * 6  # stopped by max_response_len 3
    assert _responses(results["topk1"]["samples"]) == [greedy[p][:5] for p in PROMPTS_B]  # top-k 1 is greedy

    def cut(tokens):  # the stop token is kept (no_stop_trim), the rest dropped
        return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens

    assert _responses(results["stopper"]["samples"]) == [cut(greedy[p][:6]) for p in PROMPTS_A]
    assert _responses(results["stopper"]["samples"])[0] == g0[: first + 1]


def test_eval_max_context_len_leaves_the_prompt_room(make, hf_model, tokenizer):
    from slime.rollout.sglang_rollout import eval_rollout_async
    from slime.utils.types import Sample
    from tests.engine.engine_test_utils import run_async

    build, a, _, _ = make
    lengths = {p: len(_ids(tokenizer, p)) for p in PROMPTS_A}
    context = min(lengths.values()) + 2  # the shortest prompt has room for 2 tokens, longer ones less
    args = build(
        "--eval-prompt-data",
        "a",
        a,
        "--eval-input-key",
        "prompt",
        "--eval-temperature",
        "0",
        "--eval-max-response-len",
        "6",
        "--rollout-max-context-len",
        "4096",
        "--eval-max-context-len",
        str(context),
    )
    samples = run_async(eval_rollout_async(args, 0))["a"]["samples"]
    for p, s, got in zip(PROMPTS_A, samples, _responses(samples), strict=True):
        room = max(0, context - lengths[p])
        want = reference_greedy(hf_model, _ids(tokenizer, p), min(6, room)) if room else []
        assert got == want, p
        assert s.status == Sample.Status.TRUNCATED and len(s.tokens) == lengths[p] + len(want) <= max(
            context, lengths[p]
        )
