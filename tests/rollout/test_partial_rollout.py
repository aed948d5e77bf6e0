"""--partial-rollout against a real engine: the long tail is aborted once enough groups are done,
its partial responses wait in the Data Buffer, and the next rollout resumes them token-exactly."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.engine.engine_test_utils import reference_logprobs, start_engine

# every test talks to a real engine server (slow_engine)
pytestmark = pytest.mark.e2e

MAX = 24  # --rollout-max-response-len


@pytest.fixture(scope="module")
def slow_engine(tiny_model_dir, tmp_path_factory):
    # 30 ms per decode step: a fresh group needs ~0.7 s, long enough to be caught mid-decode
    eng = start_engine(tiny_model_dir, "--step-delay-ms", "30", log_dir=tmp_path_factory.mktemp("log"))
    yield eng
    eng.stop()


@pytest.fixture
def make(tiny_model_dir, slow_engine, tmp_path):
    from slime.arguments import parse_args
    from slime.data.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import GenerateState

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "label": str(2 * i)}) + "\n" for i in range(20)))
    host, port = slow_engine.url.removeprefix("http://").rsplit(":", 1)

    def build(*extra: str):
        GenerateState.reset()
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
                "2",
                "--rollout-batch-size",
                "2",
                "--n-samples-per-prompt",
                "2",
                "--rollout-max-response-len",
                str(MAX),
                "--sglang-router-ip",
                host,
                "--sglang-router-port",
                port,
                "--run-dir",
                str(tmp_path / "run"),
                *extra,
            ]
        )
        return args, RolloutDataSourceWithBuffer(args)

    yield build
    GenerateState.reset()


def _set_version(engine, version: str) -> None:
    import httpx

    httpx.post(f"{engine.url}/update_weight_version", json={"new_version": version}, timeout=10).raise_for_status()


def _aborted_after(args, groups, n_tokens: int) -> None:
    """Generate `n_tokens` of every sample, then mark it ABORTED: what an abort leaves behind."""
    from slime.rollout.sglang_rollout import GenerateState, generate
    from slime.utils.types import Sample

    params = dict(GenerateState(args).sampling_params, max_new_tokens=n_tokens, ignore_eos=True)

    async def go():
        await asyncio.gather(*(generate(args, s, params) for g in groups for s in g))

    asyncio.run(go())
    for g in groups:
        for s in g:
            s.status = Sample.Status.ABORTED


def _check_token_exact(sample, hf_model) -> None:
    """The trained tokens and log-probs are exactly the engine's: an independent HF forward over
    prompt + response gives the same log-probs (temperature 1), across the resume boundary."""
    prompt, response = sample.tokens[: sample.prompt_length], sample.tokens[sample.prompt_length :]
    assert len(response) == sample.response_length == len(sample.loss_mask) == len(sample.rollout_log_probs)
    ref = reference_logprobs(hf_model, prompt, response, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, sample.rollout_log_probs, strict=True)) < 1e-4


def test_partial_rollout_aborts_the_tail_and_resumes_it(make, slow_engine, hf_model):
    from slime.rollout.sglang_rollout import generate_rollout
    from slime.utils.types import Sample

    args, source = make("--partial-rollout", "--over-sampling-batch-size", "3")
    # Two groups left by an earlier rollout with MAX - 2 tokens each, under weights "v1" ...
    _set_version(slow_engine, "v1")
    near_done = source.get_samples(2)
    _aborted_after(args, near_done, MAX - 2)
    source.add_samples(near_done)
    prefixes = {s.index: list(s.tokens) for g in near_done for s in g}
    # ... now the weights are "v2": the buffered groups finish in 2 steps, the fresh one is the tail.
    _set_version(slow_engine, "v2")
    out = generate_rollout(args, 1, source)

    assert sorted(g[0].group_index for g in out.samples) == [0, 1]  # the buffer was served first
    for s in (s for g in out.samples for s in g):
        assert s.tokens[: len(prefixes[s.index])] == prefixes[s.index]  # continued, not regenerated
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and s.response_length <= MAX
        assert s.weight_versions == ["v1", "v2"] and s.loss_mask == [1] * s.response_length
        assert s.reward is not None
        _check_token_exact(s, hf_model)
    assert out.metrics["rollout/buffer/resumed_groups"] == 2.0
    assert out.metrics["rollout/buffer/returned_groups"] == 1.0 and source.get_buffer_length() == 1

    # The aborted tail waits in the buffer with whatever it had generated.
    tail = source.buffer[0]
    # (a sample may have met its end-of-sequence token before the abort: that one is finished)
    assert any(s.status == Sample.Status.ABORTED for s in tail)
    assert all(s.response_length < MAX for s in tail if s.status == Sample.Status.ABORTED)
    partial = {s.index: list(s.tokens) for s in tail}

    # Next rollout: the tail is resumed first and finished, token-exact across the resume.
    args.over_sampling_batch_size = None
    out2 = generate_rollout(args, 2, source)
    resumed = next(g for g in out2.samples if g[0].group_index == tail[0].group_index)
    for s in resumed:
        assert s.tokens[: len(partial[s.index])] == partial[s.index]
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert s.weight_versions[-1] == "v2"
        _check_token_exact(s, hf_model)
    assert source.get_buffer_length() == 0


def test_without_partial_rollout_the_tail_is_discarded_and_counted(make):
    from slime.rollout.sglang_rollout import generate_rollout

    # over-sampling needs a reason (a filter or --partial-rollout): a filter that keeps every group
    args, source = make(
        "--over-sampling-batch-size",
        "3",
        "--rollout-batch-size",
        "1",
        "--dynamic-sampling-filter-path",
        "tests.contracts.hooks.keep_all",
    )
    out = generate_rollout(args, 0, source)
    assert len(out.samples) == 1
    assert out.metrics["rollout/partial/discarded_groups"] == 2.0 and source.get_buffer_length() == 0


def test_mask_offpolicy_zeroes_the_tokens_of_older_weights(make, hf_model):
    from slime.rollout.sglang_rollout import generate_rollout

    args, source = make("--partial-rollout", "--mask-offpolicy-in-partial-rollout")
    groups = source.get_samples(2)
    _aborted_after(args, groups, 5)
    source.add_samples(groups)
    out = generate_rollout(args, 1, source)
    for s in (s for g in out.samples for s in g):
        assert s.loss_mask[:5] == [0] * 5 and s.loss_mask[5:] == [1] * (s.response_length - 5)
        _check_token_exact(s, hf_model)
