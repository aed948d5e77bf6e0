"""--rollout-max-context-len and --rollout-sample-hook-path on the default rollout against a real
engine: every sample (prompt + response) fits the context, a sample stopped by the limit ends
exactly at it, and each generated sample passes the hook once, before its reward."""

from __future__ import annotations

import json

import pytest

from tests.engine.engine_test_utils import start_engine

CONTEXT = 14


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    eng = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("log"))
    yield eng
    eng.stop()


def test_default_rollout_fits_the_context_and_runs_sample_hooks(tiny_model_dir, engine, tmp_path, tokenizer):
    from slime.arguments import parse_args
    from slime.data.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import GenerateState, generate_rollout
    from slime.utils.types import Sample
    from tests.contracts import hooks

    data = tmp_path / "p.jsonl"
    prompts = [f"{i}+{i * 7}=" for i in range(6)] + ["1+2+3+4+5+6+7+8+9+10+11+12="]  # the last one is too long
    data.write_text("".join(json.dumps({"prompt": p, "label": "0"}) + "\n" for p in prompts))
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    GenerateState.reset()
    hooks.CALLS.pop("sample_hook", None)
    try:
        args = parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--prompt-data",
                str(data),
                "--input-key",
                "prompt",
                "--label-key",
                "label",
                "--custom-rm-path",
                "tests.e2e.hooks.digit_reward",
                "--num-rollout",
                "1",
                "--rollout-batch-size",
                "3",
                "--n-samples-per-prompt",
                "2",
                "--rollout-max-context-len",
                str(CONTEXT),
                "--rollout-temperature",
                "1.0",
                "--rollout-sample-hook-path",
                "tests.contracts.hooks.sample_hook",
                "--sglang-router-ip",
                host,
                "--sglang-router-port",
                port,
                "--run-dir",
                str(tmp_path / "r"),
            ]
        )
        assert args.rollout_max_prompt_len == CONTEXT - 1
        source = RolloutDataSourceWithBuffer(args)
        assert len(tokenizer(prompts[-1], add_special_tokens=False)["input_ids"]) > CONTEXT - 1
        assert source.num_dropped == 1  # slime's rule: prompts longer than context - 1 are left out
        out = generate_rollout(args, 3, source)
    finally:
        GenerateState.reset()
    samples = [s for g in out.samples for s in g]
    assert len(samples) == 6
    for s in samples:
        assert len(s.tokens) <= CONTEXT and s.response_length >= 1
        assert len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length
        if s.status == Sample.Status.TRUNCATED:  # stopped by the limit, not by end-of-sequence
            assert len(s.tokens) == CONTEXT
        assert s.metadata["hooks"] == ["first"] and s.reward is not None
    calls = hooks.CALLS["sample_hook"]
    assert sorted(c[0] for c in calls) == sorted(s.index for s in samples)  # once per sample
    assert all(c[1] == 3 and c[2] is False and c[3] is None for c in calls)  # rollout id, before the reward
    assert any(s.status == Sample.Status.TRUNCATED for s in samples)  # the limit did bind
    # slime's spans on every sample (slime.observability.trace_utils): generation, then the reward
    from slime.observability.trace_timeline import chrome_trace

    for s in samples:
        spans = [(e["type"], e["name"]) for e in s.trace["events"]]
        assert spans == [
            ("span_start", "sglang_generate"),
            ("span_end", "sglang_generate"),
            ("span_start", "reward_model"),
            ("span_end", "reward_model"),
        ], spans
        assert s.trace["sample_id"] == s.index and s.trace["group_id"] == s.group_index
    boxes = [e for e in chrome_trace(samples)["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in boxes) == sorted(["sglang_generate", "reward_model"] * len(samples))
    assert all(e["dur"] >= 0 for e in boxes)
