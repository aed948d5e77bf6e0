"""Multi-turn trajectories against a real engine: a scripted tool conversation has exactly the
tokens, loss mask and log-probs it should, and the turn and token limits hold."""

from __future__ import annotations

import pytest

from tests.engine.engine_test_utils import reference_logprobs
from tests.engine.engine_test_utils import run_async as _run

TURN = 4  # tokens per model turn (ignore_eos: every turn is exactly this long)


@pytest.fixture
def args(tiny_model_dir, engine, tmp_path):
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    GenerateState.reset()
    yield parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            "unused.jsonl",
            "--rm-type",
            "math",
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "1",
            "--rollout-max-response-len",
            "64",
            "--sglang-router-ip",
            host,
            "--sglang-router-port",
            port,
            "--run-dir",
            str(tmp_path),
        ]
    )
    GenerateState.reset()


def _params(args, **kw):
    from slime.rollout.sglang_rollout import GenerateState

    return dict(GenerateState(args).sampling_params, ignore_eos=True, **kw)


def test_scripted_tool_conversation_has_exact_tokens_mask_and_logprobs(args, tokenizer, hf_model):
    from slime.rollout.multi_turn import run_multi_turn
    from slime.utils.types import Sample

    seen: list[str] = []
    script = ["<result>42</result>", [17, 18, 19]]  # a text observation, then raw token ids

    def env_step(text, trajectory):
        seen.append(text)
        return script.pop(0) if script else None

    sample = Sample(index=0, prompt="1+1=")
    out = _run(run_multi_turn(args, sample, _params(args), env_step, max_new_tokens_per_turn=TURN))

    obs1 = tokenizer.encode("<result>42</result>", add_special_tokens=False)
    prompt = tokenizer.encode("1+1=", add_special_tokens=False)
    assert out.status == Sample.Status.COMPLETED and out.metadata["stop_reason"] == "env_done"
    turns = out.metadata["turns"]
    assert [(t["role"], t["end"] - t["start"]) for t in turns] == [
        ("model", TURN),
        ("env", len(obs1)),
        ("model", TURN),
        ("env", 3),
        ("model", TURN),
    ]
    # the exact expected mask, written out
    assert out.loss_mask == [1] * TURN + [0] * len(obs1) + [1] * TURN + [0] * 3 + [1] * TURN
    resp = out.tokens[len(prompt) :]
    assert out.tokens[: len(prompt)] == prompt and out.response_length == len(resp) == len(out.loss_mask)
    assert resp[TURN : TURN + len(obs1)] == obs1 and resp[2 * TURN + len(obs1) : 2 * TURN + len(obs1) + 3] == [
        17,
        18,
        19,
    ]
    # what the environment saw is the text of each model turn's tokens
    model_spans = [resp[t["start"] : t["end"]] for t in turns if t["role"] == "model"]
    assert seen == [tokenizer.decode(span) for span in model_spans[:3]]
    # log-probs: the engine's for model tokens (= an independent HF forward over the whole
    # trajectory, so each turn saw exactly the tokens trained on), 0.0 for tool tokens
    ref = reference_logprobs(hf_model, prompt, resp, 1.0)
    for pos, (mask, lp, r) in enumerate(zip(out.loss_mask, out.rollout_log_probs, ref, strict=True)):
        assert (abs(lp - r) < 1e-4) if mask else lp == 0.0, pos
    assert len(out.weight_versions) == 3 and out.session_id


def test_turn_and_token_limits(args):
    from slime.rollout.multi_turn import run_multi_turn
    from slime.utils.types import Sample

    def always_more(text, trajectory):
        return "<obs>"

    out = _run(
        run_multi_turn(
            args, Sample(prompt="2+2="), _params(args), always_more, max_turns=3, max_new_tokens_per_turn=TURN
        )
    )
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_turns"
    assert sum(t["role"] == "model" for t in out.metadata["turns"]) == 3

    out = _run(
        run_multi_turn(
            args, Sample(prompt="2+2="), _params(args), always_more, max_total_tokens=30, max_new_tokens_per_turn=TURN
        )
    )
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_tokens"
    assert len(out.tokens) <= 30 and len(out.loss_mask) == out.response_length

    # the response budget (max_new_tokens) counts model and tool tokens together
    out = _run(
        run_multi_turn(
            args, Sample(prompt="2+2="), _params(args, max_new_tokens=10), always_more, max_new_tokens_per_turn=TURN
        )
    )
    assert out.response_length <= 10 and out.status == Sample.Status.TRUNCATED


def test_no_response_budget_runs_until_the_context_is_full(args, tiny_model_dir):
    """max_new_tokens None (slime's default --rollout-max-response-len): turns are capped only by
    --max-new-tokens-per-turn, and a turn the engine cut at the context length ends it TRUNCATED."""
    import json

    from slime.rollout.multi_turn import run_multi_turn
    from slime.utils.types import Sample

    context = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    turns = []

    def one_more(text, trajectory):
        turns.append(text)
        return None if len(turns) == 2 else "<obs>"

    capped = _run(
        run_multi_turn(
            args, Sample(prompt="2+2="), _params(args, max_new_tokens=None), one_more, max_new_tokens_per_turn=TURN
        )
    )
    assert capped.status == Sample.Status.COMPLETED
    assert [t["end"] - t["start"] for t in capped.metadata["turns"] if t["role"] == "model"] == [TURN, TURN]
    full = _run(
        run_multi_turn(
            args, Sample(prompt="2+2="), _params(args, max_new_tokens=None), lambda text, trajectory: "<obs>"
        )
    )
    assert full.status == Sample.Status.TRUNCATED and full.metadata["stop_reason"] == "max_tokens"
    assert len(full.tokens) == context - 1  # the engine's room: every position but one
