"""slime module paths for rollout code: `slime.rollout.sglang_streaming_rollout`,
`slime.backends.megatron_utils.cp_utils`, the data source's metadata
(`slime.rollout.data_source`), `--rm-type ifbench` (`slime.rollout.rm_hub.ifbench`), and the
placement-group builders slime's train.py calls (`slime.ray.placement_group`).

Each is checked against a reference computed here: the streaming generate against the default
(non-streaming) generate on the same fake SGLang server, cp_utils against hand-computed masked
means, metadata through a real checkpoint round trip."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from aiohttp import web

from slime.errors import SlimeError
from slime.utils.types import Sample
from tests.helpers import make_args, stub_generate_state

# ------------------------------------------------------------------ streaming generate


def _answer(input_ids: list[int], params: dict) -> tuple[list[int], list[float], list[str], str]:
    """The fake engine's deterministic answer: token ids, log-probs, per-token texts, finish type."""
    n = int(params["max_new_tokens"])
    stop = 5  # a "stop" after 5 tokens when the budget allows more
    count = min(n, stop)
    start = sum(input_ids) % 50
    ids = [1000 + start + i for i in range(count)]
    lps = [-0.125 * (i + 1) for i in range(count)]
    texts = [f"w{t} " for t in ids]
    return ids, lps, texts, "stop" if n > stop else "length"


class FakeSGLang:
    """SGLang's /generate: one JSON answer, or with `stream: true` cumulative SSE chunks ending in
    `data: [DONE]`. `hold_after` chunks in, a streaming answer waits for `release`, then ends as
    an engine abort does (one more chunk, finish_reason "abort") or drops the connection
    (`on_release`); `split` writes each event in two pieces; `no_finish` ends the stream early."""

    def __init__(self, hold_after: int | None = None, split: bool = False, no_finish: bool = False):
        self.hold_after, self.split, self.no_finish = hold_after, split, no_finish
        self.payloads: list[dict] = []
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.on_release = "abort_chunk"  # or "drop": close the connection

    def _chunk(self, ids, lps, texts, upto: int, finish: str | None) -> dict:
        meta = {"output_token_logprobs": [[lps[i], ids[i], None] for i in range(upto)], "weight_version": "7"}
        if finish:
            meta["finish_reason"] = {"type": finish}
        return {"text": "".join(texts[:upto]), "output_ids": ids[:upto], "meta_info": meta}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.payloads.append(body)
        if "bogus" in body["sampling_params"]:
            return web.json_response({"error": {"message": "unknown sampling parameter 'bogus'"}}, status=400)
        ids, lps, texts, finish = _answer(body["input_ids"], body["sampling_params"])
        if not body.get("stream"):
            return web.json_response(self._chunk(ids, lps, texts, len(ids), finish))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for upto in range(1, len(ids) + 1):
            last = upto == len(ids)
            if self.no_finish and last:
                break
            if self.hold_after is not None and upto > self.hold_after:
                self.held.set()
                await self.release.wait()
                if self.on_release == "drop":
                    request.transport.close()
                    return resp
                last, finish = True, "abort"
            event = f"data: {json.dumps(self._chunk(ids, lps, texts, upto, finish if last else None))}\n\n"
            if self.split:
                await resp.write(event[:7].encode())
                await asyncio.sleep(0.01)
                event = event[7:]
            await resp.write(event.encode())
            if last:
                break
        if not self.no_finish:
            await resp.write(b"data: [DONE]\n\n")
        return resp


async def _serve(fake: FakeSGLang):
    app = web.Application()
    app.router.add_post("/generate", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@pytest.fixture
def gen_state(monkeypatch):
    from slime.rollout.generation import GenerateState

    yield lambda args: stub_generate_state(monkeypatch, args)
    GenerateState.reset()


def _prompt_sample(prompt_ids=(3, 4, 5)) -> Sample:
    return Sample(index=0, prompt="p", tokens=list(prompt_ids), response_length=0)


def _both(args_for_port, samples, params, fake=None):
    """(default generate's samples, generate_streaming's samples) on the same fake server."""
    from slime.rollout.generation import generate
    from slime.rollout.sglang_streaming_rollout import generate_streaming

    async def main():
        runner, port = await _serve(fake or FakeSGLang())
        try:
            args = args_for_port(port)
            plain = [await generate(args, s[0], dict(params)) for s in samples]
            streamed = [await generate_streaming(args, s[1], dict(params)) for s in samples]
            return plain, streamed
        finally:
            await runner.cleanup()

    return asyncio.run(main())


FIELDS = ("tokens", "response", "response_length", "loss_mask", "rollout_log_probs", "status", "weight_versions")


def _args(gen_state, port, **kw):
    args = make_args(sglang_router_ip="127.0.0.1", sglang_router_port=port, **kw)
    gen_state(args)
    return args


@pytest.mark.parametrize("max_new", [3, 8])  # finishes on length / on stop
def test_streaming_generate_matches_the_default_generate(gen_state, max_new):
    pairs = [(_prompt_sample(), _prompt_sample())]
    plain, streamed = _both(lambda port: _args(gen_state, port), pairs, {"max_new_tokens": max_new})
    ids, lps, texts, finish = _answer([3, 4, 5], {"max_new_tokens": max_new})
    got = streamed[0]
    assert got.tokens == [3, 4, 5, *ids] and got.response == "".join(texts)
    assert got.rollout_log_probs == lps and got.loss_mask == [1] * len(ids)
    assert got.status is (Sample.Status.TRUNCATED if finish == "length" else Sample.Status.COMPLETED)
    for f in FIELDS:
        assert getattr(got, f) == getattr(plain[0], f), f


def test_streaming_generate_resumes_a_partial_sample(gen_state):
    def partial():
        s = Sample(index=1, prompt="p", tokens=[3, 4, 5, 900, 901], response="ab", response_length=2)
        s.loss_mask, s.rollout_log_probs, s.status = [1, 1], [-1.0, -2.0], Sample.Status.ABORTED
        s.weight_versions = ["6"]
        return s

    fake = FakeSGLang()
    plain, streamed = _both(lambda port: _args(gen_state, port), [(partial(), partial())], {"max_new_tokens": 4}, fake)
    # the budget left is 4 - 2 generated already; what is sent is prompt + response so far
    assert [p["sampling_params"]["max_new_tokens"] for p in fake.payloads] == [2, 2]
    assert fake.payloads[1]["input_ids"] == [3, 4, 5, 900, 901] and fake.payloads[1]["stream"] is True
    ids, lps, texts, _ = _answer([3, 4, 5, 900, 901], {"max_new_tokens": 2})
    got = streamed[0]
    assert got.tokens == [3, 4, 5, 900, 901, *ids] and got.response == "ab" + "".join(texts)
    assert got.rollout_log_probs == [-1.0, -2.0, *lps] and got.response_length == 4
    for f in FIELDS:
        assert getattr(got, f) == getattr(plain[0], f), f


def test_streaming_generate_reads_events_split_over_reads(gen_state):
    pairs = [(_prompt_sample(), _prompt_sample())]
    plain, streamed = _both(lambda port: _args(gen_state, port), pairs, {"max_new_tokens": 8}, FakeSGLang(split=True))
    for f in FIELDS:
        assert getattr(streamed[0], f) == getattr(plain[0], f), f


@pytest.mark.parametrize("engine_side", ["abort_chunk", "drop"])
def test_abort_mid_stream_leaves_the_partial_answer_on_the_sample(gen_state, engine_side):
    """The rollout sets `aborted` and aborts the engines; the engine either sends a last chunk with
    finish_reason "abort" or drops the request. Either way the sample keeps what was streamed."""
    from slime.rollout.generation import GenerateState
    from slime.rollout.sglang_streaming_rollout import generate_streaming

    fake = FakeSGLang(hold_after=2)
    fake.on_release = engine_side

    async def main():
        runner, port = await _serve(fake)
        try:
            args = _args(gen_state, port)
            sample = _prompt_sample()
            task = asyncio.ensure_future(generate_streaming(args, sample, {"max_new_tokens": 8}))
            await asyncio.wait_for(fake.held.wait(), 10)
            await asyncio.sleep(0.05)  # the second chunk is read
            seen = (list(sample.tokens), sample.response, list(sample.rollout_log_probs), sample.status)
            GenerateState(args).aborted = True
            fake.release.set()
            return seen, await asyncio.wait_for(task, 10)
        finally:
            await runner.cleanup()

    seen, out = asyncio.run(main())
    ids, lps, texts, _ = _answer([3, 4, 5], {"max_new_tokens": 8})
    # mid-stream, the sample already carries the two tokens streamed so far, still pending
    assert seen == ([3, 4, 5, *ids[:2]], "".join(texts[:2]), lps[:2], Sample.Status.PENDING)
    n = 3 if engine_side == "abort_chunk" else 2
    assert out.status is Sample.Status.ABORTED
    assert out.tokens == [3, 4, 5, *ids[:n]] and out.loss_mask == [1] * n and out.response_length == n
    assert out.rollout_log_probs == lps[:n] and out.response == "".join(texts[:n])


def test_streaming_generate_errors(gen_state):
    from slime.rollout.sglang_streaming_rollout import generate_streaming
    from slime.utils.http_utils import EngineRequestFailed, EngineUnreachable

    async def run(fake, sample, params):
        runner, port = await _serve(fake)
        try:
            return await generate_streaming(_args(gen_state, port), sample, params)
        finally:
            await runner.cleanup()

    with pytest.raises(EngineUnreachable, match="before the answer finished"):
        asyncio.run(run(FakeSGLang(no_finish=True), _prompt_sample(), {"max_new_tokens": 8}))
    done = _prompt_sample()
    done.status = Sample.Status.COMPLETED
    with pytest.raises(SlimeError, match="not pending or aborted"):
        asyncio.run(run(FakeSGLang(), done, {"max_new_tokens": 8}))
    # nothing left to generate: TRUNCATED without a request, as the default generate does
    fake = FakeSGLang()
    out = asyncio.run(run(fake, _prompt_sample(), {"max_new_tokens": 0}))
    assert out.status is Sample.Status.TRUNCATED and fake.payloads == [] and out.response == ""
    with pytest.raises(EngineRequestFailed, match="HTTP 400.*bogus"):
        asyncio.run(run(FakeSGLang(), _prompt_sample(), {"max_new_tokens": 8, "bogus": 1}))


def test_streaming_generate_as_custom_generate_function(gen_state, tmp_path):
    """Wired as slime wires it: --custom-generate-function-path, through generate_and_rm."""
    from slime.rollout.sglang_rollout import generate_and_rm

    path = "slime.rollout.sglang_streaming_rollout.generate_streaming"

    async def main():
        fake = FakeSGLang()
        runner, port = await _serve(fake)
        try:
            args = _args(gen_state, port, custom_generate_function_path=path, rm_type="random")
            sample = await generate_and_rm(args, _prompt_sample(), {"max_new_tokens": 8})
            return fake, sample
        finally:
            await runner.cleanup()

    fake, sample = asyncio.run(main())
    assert fake.payloads[0]["stream"] is True
    assert sample.status is Sample.Status.COMPLETED and sample.reward in (0, 1)


# ------------------------------------------------------------------ cp_utils


def test_cp_utils_are_identities_at_size_one():
    from slime.backends.megatron_utils.cp_utils import (
        all_gather_with_cp,
        get_context_parallel_world_size,
        slice_log_prob_with_cp,
        slice_with_cp,
    )

    assert get_context_parallel_world_size() == 1
    t = torch.arange(6.0)
    assert all_gather_with_cp(t, 10, 6) is t
    assert slice_with_cp(t, 0) is t
    lp = [-0.5, -1.0, -2.0]
    assert slice_log_prob_with_cp(lp, 7, 3) is lp
    assert slice_log_prob_with_cp(t, 9, 6) is t
    with pytest.raises(SlimeError, match="log_prob length mismatch"):
        slice_log_prob_with_cp(lp, 7, 4)


def test_cp_utils_sum_of_sample_mean():
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean

    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    masks = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0])]
    lengths = [2, 3, 1]
    # per sample: masked mean (an all-masked sample divides by 1): 1/1 + (3+4+5)/3 + 0/1
    assert get_sum_of_sample_mean([5, 6, 2], lengths, masks)(x).item() == pytest.approx(1.0 + 4.0 + 0.0)
    assert get_sum_of_sample_mean([5, 6, 2], lengths, masks, calculate_per_token_loss=True)(x).item() == 13.0
    denoms = [torch.tensor(4.0), torch.tensor(4.0), torch.tensor(0.0)]  # a group's shared token count
    assert get_sum_of_sample_mean([5, 6, 2], lengths, masks, denoms)(x).item() == pytest.approx(1 / 4 + 12 / 4)


def test_cp_size_above_one_is_refused(monkeypatch):
    from slime.backends.megatron_utils import cp_utils

    cp_utils.configure_context_parallel(make_args())  # the default size, 1
    with pytest.raises(SlimeError, match="context parallelism is not supported"):
        cp_utils.configure_context_parallel(make_args("--context-parallel-size", "2"))
    assert cp_utils.get_context_parallel_world_size() == 1
    with pytest.raises(SlimeError, match="context parallelism"):
        cp_utils.get_logits_and_tokens_offset_with_cp(10, 4)
    monkeypatch.setattr(cp_utils, "_cp_size", 2)  # as if a size of 2 had got through
    for call in (
        lambda: cp_utils.all_gather_with_cp(torch.zeros(3), 5, 3),
        lambda: cp_utils.slice_with_cp(torch.zeros(3), 0),
        lambda: cp_utils.slice_log_prob_with_cp([0.0], 3, 1),
        lambda: cp_utils.get_sum_of_sample_mean([3], [1], [torch.ones(1)]),
    ):
        with pytest.raises(SlimeError, match="--context-parallel-size 2"):
            call()


def test_slime_mis_example_calls_cp_utils_like_this():
    """slime's train_infer_mismatch example gathers then slices each sample's log-probs; at size 1
    the round trip hands back the same values."""
    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

    log_probs = [torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-1.0])]
    totals, resp = [7, 4], [3, 1]
    full = [all_gather_with_cp(lp, t, r) for lp, t, r in zip(log_probs, totals, resp, strict=True)]
    back = torch.cat([slice_log_prob_with_cp(f, t, r) for f, t, r in zip(full, totals, resp, strict=True)])
    assert back.tolist() == pytest.approx([-0.1, -0.2, -0.3, -1.0])


# ------------------------------------------------------------------ data source metadata


def _prompts(tmp_path, n=4):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(n)))
    return path


def test_data_source_metadata_update_get_and_checkpoint(tmp_path):
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    def source(**kw):
        return RolloutDataSourceWithBuffer(
            make_args(prompt_data=str(_prompts(tmp_path)), input_key="prompt", label_key="label", **kw)
        )

    src = source(save=str(tmp_path / "ckpt"))
    assert src.get_metadata() == {}
    src.update_metadata({"0": [1, 2]})
    src.update_metadata({"1": [3], "0": [4]})  # dict.update: a key given again is replaced
    assert src.get_metadata() == {"0": [4], "1": [3]}
    src.get_metadata()["2"] = []  # slime hands out the live dict
    assert src.get_metadata() == {"0": [4], "1": [3], "2": []}
    src.get_samples(1)
    src.save(3)
    src.update_metadata({"after": 1})  # not in the checkpoint
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3\n")

    resumed = source(load=str(tmp_path / "ckpt"))
    resumed.load()
    assert resumed.get_metadata() == {"0": [4], "1": [3], "2": []}
    assert resumed.get_samples(1)[0][0].prompt == src.get_samples(1)[0][0].prompt

    # a state saved without metadata (an older checkpoint) resumes with an empty dict
    state = resumed.state_dict()
    del state["metadata"]
    fresh = source()
    fresh.update_metadata({"x": 1})
    fresh.load_state_dict(state)
    assert fresh.get_metadata() == {}


def test_data_source_classes_stay_the_data_packages():
    from slime.data import data_source as data
    from slime.rollout import data_source

    assert issubclass(data_source.RolloutDataSourceWithBuffer, data.RolloutDataSourceWithBuffer)
    assert issubclass(data_source.RolloutDataSource, data.RolloutDataSource)
    assert data_source.DataSource is data.DataSource and data_source.pop_first is data.pop_first


# ------------------------------------------------------------------ --rm-type ifbench

PALINDROMES = "level radar civic kayak rotor refer stats tenet madam racecar"


@pytest.mark.parametrize(
    "instruction_id, kwargs, follows, breaks",
    [
        # punctuation goes first: "3.14" is one number, "1,000" one, "x2y" one
        ("count:numbers", {"N": 3}, "Pi is 3.14, a grand is 1,000 and x2y.", "Only 3.14 and 7 here."),
        ("count:numbers", {"N": 0}, "No digits at all.", "Route 66."),
        ("words:palindrome", {}, PALINDROMES + ", Level!", "level radar civic kayak rotor refer stats tenet madam"),
        ("words:palindrome", {}, " ".join(["Rotor."] * 10), "noon " * 12),  # 4 letters is too short
        ("format:parentheses", {}, "a (b [c {d (e [f] e) d} c] b) a", "(b [c {d (e) d} c] b)"),
        ("format:parentheses", {}, "x ([{([ ])}]) y", "([{(] [ ])}])"),  # a mismatch starts over
        ("format:quotes", {}, 'He said "she said \'they said "go" now\' ok" end', "\"one 'two' one\""),
        ("format:quotes", {}, "'a \"b 'c' b\" a'", '"a "b" a"'),  # same quote closes, not nests
        ("words:prime_lengths", {}, "We are all so close, my dog.", "We are all so close, friend."),
        ("format:output_template", {}, "Future Outlook: up My Answer: 4 My Conclusion: done", "My Answer: 4"),
        ("format:no_whitespace", {}, "no-spaces-here", "one\ttab"),
    ],
)
def test_ifbench_builtin_checks(instruction_id, kwargs, follows, breaks, monkeypatch):
    from slime.rollout.rm_hub import ifbench

    monkeypatch.setattr(ifbench, "_official_registry", lambda: None)  # the checks written here
    meta = {"instruction_id_list": [instruction_id], "kwargs": [kwargs], "prompt_text": "p"}
    assert ifbench.compute_ifbench_reward(follows, None, metadata=meta) == 1.0
    assert ifbench.compute_ifbench_reward(breaks, None, metadata=meta) == 0.0


def test_ifbench_reward_rules_and_rm_type(monkeypatch):
    from slime.rollout.rm_hub import async_rm, ifbench

    monkeypatch.setattr(ifbench, "_official_registry", lambda: None)
    both = {"instruction_id_list": ["format:no_whitespace", " count:numbers ", None, ""], "kwargs": {"N": 1}}
    # every instruction must be followed; the dict of kwargs serves each one
    assert ifbench.follow_instruction_list("a1", both) == [True, True]
    assert ifbench.follow_instruction_list("a 1", both) == [False, True]
    assert ifbench.compute_ifbench_reward("a1", None, both) == 1.0
    assert ifbench.compute_ifbench_reward("a 1", None, both) == 0.0
    # a kwargs list shorter than the ids is padded with its last entry; None values are dropped
    padded = {"instruction_id_list": ["count:numbers", "count:numbers"], "kwargs": [{"N": 2, "x": None}]}
    assert ifbench.compute_ifbench_reward("1 and 2", None, padded) == 1.0
    # no metadata, no ids, no response, a blank response: 0 (IFBench's strict rule)
    assert ifbench.compute_ifbench_reward("1", None, None) == 0.0
    assert ifbench.compute_ifbench_reward("1", None, {"instruction_id_list": []}) == 0.0
    assert ifbench.compute_ifbench_reward("   ", None, {"instruction_id_list": ["format:output_template"]}) == 0.0
    with pytest.raises(SlimeError, match="no verifier for instruction 'punctuation:no_comma'.*install the `ifbench`"):
        ifbench.compute_ifbench_reward("x", None, {"instruction_id_list": ["punctuation:no_comma"]})
    with pytest.raises(SlimeError, match="needs kwargs \\['N'\\]"):
        ifbench.compute_ifbench_reward("x", None, {"instruction_id_list": ["count:numbers"]})

    args = make_args(rm_type="ifbench")
    meta = {"instruction_id_list": ["format:output_template"], "kwargs": [{}]}
    good = Sample(response="My Answer: a My Conclusion: b Future Outlook: c", metadata=dict(meta))
    bad = Sample(response="My Answer: a", metadata=dict(meta))
    assert asyncio.run(async_rm(args, good)) == 1.0 and asyncio.run(async_rm(args, bad)) == 0.0


def test_ifbench_uses_ifbenchs_own_verifiers_when_installed(monkeypatch):
    """With the `ifbench` package, its registry decides (as slime's evaluation_lib does): kwargs to
    build_description, then the prompt for a verifier whose arguments name it."""
    from slime.rollout.rm_hub import ifbench

    calls = []

    class EchoesPrompt:
        def __init__(self, instruction_id):
            self.id, self.args = instruction_id, None

        def build_description(self, **kw):
            calls.append(kw)
            self.args = {**(self.args or {}), **kw}

        def get_instruction_args(self):
            return {"prompt": None, **(self.args or {})}

        def check_following(self, value):
            return value.startswith(self.args["prompt"])

    monkeypatch.setattr(ifbench, "_official_registry", lambda: {"repeat:repeat_simple": EchoesPrompt})
    meta = {"instruction_id_list": ["repeat:repeat_simple"], "kwargs": [{"k": 1, "gone": None}], "prompt_text": "Q?"}
    assert ifbench.compute_ifbench_reward("Q? answer", None, meta) == 1.0
    assert calls == [{"k": 1}, {"prompt": "Q?"}]
    assert ifbench.compute_ifbench_reward("answer", None, meta) == 0.0
    # ids its registry lacks still fall back to the checks written here
    assert ifbench.compute_ifbench_reward("a1", None, {"instruction_id_list": ["format:no_whitespace"]}) == 1.0


# ------------------------------------------------------------------ slime's train.py builders


@pytest.mark.e2e
def test_slime_train_py_builders_in_slimes_order(ray_cluster, tiny_model_dir, task_dir, tmp_path):
    """slime's train.py start-up: placement, rollout manager (engines up), trainer (model loaded),
    then the first weight update, through the objects the builders returned."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from slime.ray.placement_group import create_placement_groups, create_rollout_manager, create_training_models

    argv = [
        "--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(task_dir / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.e2e.hooks.digit_reward", "--num-epoch", "1", "--rollout-batch-size", "4",
        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--global-batch-size", "4",
        "--micro-batch-size", "2", "--colocate", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    from slime.arguments import parse_args

    args = parse_args(argv)
    num_prompts = sum(1 for _ in (task_dir / "train.jsonl").open())
    pgs = create_placement_groups(args)
    rollout_manager = actor_model = None
    try:
        assert pgs["actor"] is pgs["rollout"] and pgs["critic"] is None
        rollout_manager, per_epoch = create_rollout_manager(args, pgs["rollout"])
        assert per_epoch == num_prompts // 4 and args.num_rollout == per_epoch  # --num-epoch 1
        actor_model, critic_model = create_training_models(args, pgs, rollout_manager)
        assert critic_model is None and args.start_rollout_id == 0
        assert actor_model.engine_urls == ray.get(rollout_manager.get_engine_urls.remote()) != []
        # slime's next step, `actor_model.update_weights()`: here slime.train's weight sync
        from slime.train import _sync_weights

        _sync_weights(args, rollout_manager, actor_model, "0")
        assert set(ray.get(rollout_manager.weight_versions.remote()).values()) == {"0"}  # the trainer's weights
        # then slime's loop: a rollout, generated by the engines the builders started, trained on
        data_ref, metrics = ray.get(rollout_manager.generate.remote(0), timeout=120)
        assert metrics["rollout/num_samples"] == 8 and not metrics.get("rollout/status/failed")
        assert "train/pg_loss" in actor_model.train(0, data_ref)
    finally:
        if rollout_manager is not None:
            ray.get(rollout_manager.dispose.remote(), timeout=60)
            ray.kill(rollout_manager)
        for actor in actor_model.actors if actor_model else []:
            ray.kill(actor)
        remove_placement_group(pgs["actor"].pg)
