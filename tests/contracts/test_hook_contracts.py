"""Contracts of every hook (as slime's tests/plugin_contracts): the documented signature works (sync
and async), a wrong signature or an import error stops at start-up naming the argument and the
path, an exception inside a per-sample hook marks that sample FAILED (traceback logged) while the
rollout goes on, and too many failures stop the run. Fast: no Ray, no engine (the rollout functions
run with custom generate hooks, so no engine is called)."""

import asyncio
import logging

import pytest

from slime.errors import SlimeError
from slime.preflight import HOOK_CALLS, check_hook, check_hooks
from slime.ray.rollout import check_failed_samples
from slime.rollout import sglang_rollout
from slime.rollout.base_types import RolloutFnTrainOutput, unwrap_train_output
from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
from slime.rollout.train_data import samples_to_train_data
from slime.utils.types import Sample
from tests.contracts import hooks
from tests.helpers import make_args as full_args
from tests.helpers import stub_generate_state

H = "tests.contracts.hooks."


def make_args(**kw):
    return full_args(**{"rm_type": "math", "rollout_batch_size": 2, "n_samples_per_prompt": 2, **kw})


@pytest.fixture
def state(monkeypatch):
    """A GenerateState without tokenizer or engine: what the rollout plumbing needs from it."""
    hooks.CALLS.update(rm=0, group_rm=[], postprocess=[])
    yield lambda args: stub_generate_state(monkeypatch, args)
    sglang_rollout.GenerateState.reset()


def group(n=2, gi=0):
    return [Sample(group_index=gi, index=gi * n + j, prompt="p", tokens=[9], metadata={}) for j in range(n)]


def run_group(args, g, evaluation=False):
    return asyncio.run(sglang_rollout.generate_and_rm_group(args, g, {"max_new_tokens": 4}, evaluation=evaluation))


class Source:
    def __init__(self, n=2):
        self.n, self.next = n, 0

    def get_samples(self, k):
        out = [group(self.n, self.next + i) for i in range(k)]
        self.next += k
        return out


# ------------------------------------------------------------------ --custom-generate-function-path


@pytest.mark.parametrize("name", ["custom_generate", "custom_generate_sync"])
def test_custom_generate_sync_and_async(state, name):
    args = make_args(custom_generate_function_path=H + name, custom_rm_path=H + "custom_rm")
    state(args)
    out = run_group(args, group())
    assert all(s.status == Sample.Status.COMPLETED and s.response.endswith(str(s.index)) for s in out)
    assert [s.reward for s in out] == [float(len(s.response)) for s in out]


def test_custom_generate_gets_evaluation_when_it_asks(state):
    args = make_args(
        custom_generate_function_path=H + "custom_generate_with_evaluation", custom_rm_path=H + "custom_rm"
    )
    state(args)
    assert [s.metadata["evaluation"] for s in run_group(args, group(), evaluation=True)] == [True, True]
    assert run_group(args, group())[0].response == "train"


def test_custom_generate_list_and_preset_rewards(state):
    args = make_args(custom_generate_function_path=H + "custom_generate_list", custom_rm_path=H + "custom_rm")
    state(args)
    out = run_group(args, group())
    assert len(out) == 4 and [s.response for s in out] == ["turn-0", "turn-1"] * 2
    assert [s.reward for s in out] == [6.0, 0.25, 6.0, 0.25]  # a reward set during generation is kept
    assert hooks.CALLS["rm"] == 2


def test_custom_generate_exception_fails_only_that_sample(state, caplog):
    args = make_args(custom_generate_function_path=H + "custom_generate_raises_on_odd", custom_rm_path=H + "custom_rm")
    state(args)
    with caplog.at_level(logging.ERROR):
        out = run_group(args, group(4))
    ok, bad = [s for s in out if s.index % 2 == 0], [s for s in out if s.index % 2]
    assert all(s.status == Sample.Status.COMPLETED and s.reward == 4.0 for s in ok)
    assert all(s.status == Sample.Status.FAILED and s.reward is None for s in bad)
    assert (
        "--custom-generate-function-path tests.contracts.hooks.custom_generate_raises_on_odd"
        in bad[0].metadata["error"]
    )
    assert "tool crashed on sample 1" in bad[0].metadata["error"]
    # the traceback is kept with the sample; the log gets a line per distinct error at the rollout's end
    # (slime.rollout.failure_report), not a traceback per sample
    assert "Traceback" in bad[0].metadata["traceback"] and "Traceback" not in caplog.text
    assert bad[0].loss_mask == [] and bad[0].response_length == 0  # well-formed, never trained on


def test_custom_generate_wrong_return_type_fails_the_sample(state):
    args = make_args(custom_generate_function_path=H + "custom_generate_wrong_type", custom_rm_path=H + "custom_rm")
    state(args)
    out = run_group(args, group())
    assert all(s.status == Sample.Status.FAILED and "not a Sample" in s.metadata["error"] for s in out)


# ------------------------------------------------------------------ --custom-rm-path / --group-rm


@pytest.mark.parametrize("name,reward", [("custom_rm", 5.0), ("custom_rm_sync", 2.0)])
def test_custom_rm_per_sample_sync_and_async(state, name, reward):
    args = make_args(custom_generate_function_path=H + "custom_generate", custom_rm_path=H + name)
    state(args)
    assert [s.reward for s in run_group(args, group(3))] == [reward] * 3
    assert hooks.CALLS["rm"] == 3


def test_group_rm_one_call_per_group(state):
    args = make_args(custom_generate_function_path=H + "custom_generate", custom_rm_path=H + "group_rm", group_rm=True)
    state(args)
    out = run_group(args, group(4))
    assert hooks.CALLS["group_rm"] == [4] and [s.reward for s in out] == [0.0, 1.0, 2.0, 3.0]


def test_custom_rm_exception_fails_only_that_sample(state, caplog):
    args = make_args(custom_generate_function_path=H + "custom_generate", custom_rm_path=H + "custom_rm_raises_on_odd")
    state(args)
    with caplog.at_level(logging.ERROR):
        out = run_group(args, group(4))
    assert [s.status for s in out] == [Sample.Status.COMPLETED, Sample.Status.FAILED] * 2
    assert "verifier exploded" in out[1].metadata["error"] and "Traceback" in out[1].metadata["traceback"]
    assert "Traceback" not in caplog.text


def test_builtin_reward_error_fails_the_sample(state):
    # remote_rm without a service: retried, then FAILED with the reason, never a silent 0
    args = make_args(
        custom_generate_function_path=H + "custom_generate",
        rm_type="remote_rm",
        rm_url="http://127.0.0.1:9/r",
        rm_max_retries=2,
        rm_retry_interval=0.01,
        rm_timeout=1,
    )
    state(args)
    out = run_group(args, group())
    assert all(s.status == Sample.Status.FAILED and s.reward is None for s in out)
    assert "remote_rm" in out[0].metadata["error"] and "after 2 attempts" in out[0].metadata["error"]


# ------------------------------------------------------------------ failure-rate threshold


def test_failure_ratio_threshold_stops_the_run():
    g = group(4)
    for s in g[:1]:
        s.status, s.metadata["error"] = Sample.Status.FAILED, "reward: ValueError: boom"
    check_failed_samples([g], 0, 0.5)  # 25% failed: goes on
    g[1].status = Sample.Status.FAILED
    check_failed_samples([g], 0, 0.5)  # 50%: still allowed
    g[2].status = Sample.Status.FAILED
    with pytest.raises(
        SlimeError, match=r"rollout 3: 3 of 4 samples FAILED \(75%\).*--max-failed-sample-ratio 0.5.*boom"
    ):
        check_failed_samples([g], 3, 0.5)
    for s in g:
        s.status = Sample.Status.FAILED
    with pytest.raises(SlimeError, match="4 of 4"):
        check_failed_samples([g], 0, 1.0)  # all failed always stops


# ------------------------------------------------------------------ --rollout-function-path / --eval-function-path


def test_rollout_function_contract(state):
    from slime.rollout.base_types import unwrap_eval_output

    groups, metrics = unwrap_train_output(hooks.rollout_function(make_args(), 0, None))
    assert groups[0][0].reward == 1.0 and metrics == {"rollout/custom": 1.0}
    data, metrics = unwrap_eval_output(hooks.rollout_function(make_args(), 0, None, evaluation=True))
    assert data["set"]["rewards"] == [1.0] and metrics == {"eval/x": 1.0}
    # the default rollout function runs hooks without an engine and returns RolloutFnTrainOutput
    args = make_args(custom_generate_function_path=H + "custom_generate", custom_rm_path=H + "custom_rm")
    state(args)
    out = asyncio.run(sglang_rollout.generate_rollout_async(args, 0, Source()))
    assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == 2


# ------------------------------------------------------------------ --dynamic-sampling-filter-path


def test_dynamic_sampling_refills_dropped_groups(state, monkeypatch):
    rewards = iter([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0] + [1.0] * 100)

    async def rm(args, sample):
        return next(rewards)

    monkeypatch.setattr(hooks, "custom_rm", rm)
    args = make_args(
        custom_generate_function_path=H + "custom_generate",
        custom_rm_path=H + "custom_rm",
        dynamic_sampling_filter_path=H + "keep_if_first_reward_positive",
        over_sampling_batch_size=1,
    )
    state(args)
    out = asyncio.run(sglang_rollout.generate_rollout_async(args, 0, Source()))
    assert len(out.samples) == 2 and all(g[0].reward > 0 for g in out.samples)
    assert out.metrics["rollout/dynamic_filter/drop_bad_first"] == 2.0
    assert out.metrics["rollout/dynamic_filter/generated_groups"] == 4.0


def test_dynamic_sampling_gives_up_with_a_clear_message(state):
    args = make_args(
        custom_generate_function_path=H + "custom_generate",
        custom_rm_path=H + "custom_rm",
        dynamic_sampling_filter_path=H + "keep_nothing_bool",
    )
    state(args)
    with pytest.raises(
        SlimeError,
        match=r"--dynamic-sampling-filter-path tests.contracts.hooks.keep_nothing_bool "
        r"kept 0 of 20 groups.*unspecified",
    ):
        asyncio.run(sglang_rollout.generate_rollout_async(args, 0, Source()))


def test_stock_nonzero_std_filter():
    g = group(3)
    for s, r in zip(g, [1.0, 1.0, 1.0], strict=True):
        s.reward = r
    out = check_reward_nonzero_std(make_args(), g)
    assert not out.keep and out.reason == "zero_std_1.0"
    g[0].reward = 0.0
    assert check_reward_nonzero_std(make_args(), g).keep


# ------------------------------------------------------------------ reward post-process / conversion


def test_custom_reward_post_process():
    g = group(2)
    for s, r in zip(g, [0.0, 1.0], strict=True):
        s.reward, s.status, s.tokens, s.response_length, s.loss_mask = r, Sample.Status.COMPLETED, [1, 2], 1, [1]
    args = make_args(custom_reward_post_process_path=H + "reward_post_process")
    data = samples_to_train_data(args, [g])
    assert data["raw_reward"] == [0.0, 1.0] and data["rewards"] == [1.0, 2.0]  # no group normalisation


def test_custom_convert_samples_to_train_data_takes_slimes_call():
    """fn(args, samples) replaces the conversion, rewards included; a FAILED sample is still never
    trained on, and columns the trainer needs are checked by name."""
    g = group(2)
    for s, r in zip(g, [0.5, 1.0], strict=True):
        s.reward, s.status, s.tokens, s.response_length, s.loss_mask = r, Sample.Status.COMPLETED, [1, 2, 3], 2, [1, 1]
    g[1].status = Sample.Status.FAILED
    data = samples_to_train_data(
        make_args(custom_convert_samples_to_train_data_path=H + "convert_samples_to_train_data"), [g]
    )
    assert data["rewards"] == [1.0, 2.0] and data["custom"] == "kept"  # no group normalisation: the hook decides
    assert data["loss_masks"] == [[1, 1], [0, 0]] and data["raw_reward"] == [1.0, 2.0] and data["truncated"] == [0, 0]
    bad = make_args(custom_convert_samples_to_train_data_path=H + "convert_without_loss_masks")
    with pytest.raises(SlimeError, match=r"convert_without_loss_masks returned no loss_masks"):
        samples_to_train_data(bad, [g])


# ------------------------------------------------------------------ --rollout-data-postprocess-path


def test_rollout_data_postprocess_runs_on_the_trainer(tiny_model_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "4",
            "--run-dir",
            str(tmp_path),
            "--micro-batch-size",
            "4",
            "--rollout-data-postprocess-path",
            H + "rollout_data_postprocess",
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    actor.train(
        7,
        {
            "tokens": [[5, 6, 7], [5, 6, 8], [9, 6, 7], [9, 6, 8]],
            "response_lengths": [1] * 4,
            "loss_masks": [[1]] * 4,
            "rewards": [1.0, -1.0, 0.5, -0.5],
        },
    )
    assert hooks.CALLS["postprocess"] == [(7, 4)]


# ------------------------------------------------------------------ start-up checks (preflight)

GOOD = {
    "rollout_function_path": "rollout_function",
    "eval_function_path": "rollout_function",
    "custom_generate_function_path": "custom_generate",
    "custom_rm_path": "custom_rm",
    "dynamic_sampling_filter_path": "keep_nothing_bool",
    "custom_reward_post_process_path": "reward_post_process",
    "custom_convert_samples_to_train_data_path": "convert_samples_to_train_data",
    "rollout_data_postprocess_path": "rollout_data_postprocess",
    "buffer_filter_path": "buffer_filter_newest",
    "rollout_sample_filter_path": "remove_odd_samples",
    "data_source_path": "ListDataSource",
    "custom_tis_function_path": "custom_tis",
    "custom_pg_loss_reducer_function_path": "pg_loss_reducer",
    "rollout_sample_hook_path": "sample_hook",
    "rollout_all_samples_process_path": "all_samples_process",
    "custom_rollout_log_function_path": "log_rollout",
    "custom_eval_rollout_log_function_path": "log_eval_rollout",
    "custom_update_weight_post_write_path": "update_weight_post_write",
    "agent_function_path": "agent",
    "custom_megatron_before_train_step_hook_path": "before_train_step",
    "custom_megatron_before_log_prob_hook_path": "before_log_prob",
}


@pytest.mark.parametrize("arg", sorted(HOOK_CALLS))
def test_preflight_accepts_documented_signatures(arg):
    check_hook(arg, H + GOOD[arg])


@pytest.mark.parametrize(
    "arg,name",
    [
        ("rollout_function_path", "rollout_function_without_evaluation"),
        ("custom_generate_function_path", "generate_missing_sampling_params"),
        ("dynamic_sampling_filter_path", "filter_three_args"),
        ("rollout_data_postprocess_path", "custom_rm"),
        ("buffer_filter_path", "custom_rm"),
        ("rollout_sample_filter_path", "rollout_data_postprocess"),
        ("custom_tis_function_path", "rollout_data_postprocess"),
        ("custom_pg_loss_reducer_function_path", "custom_rm"),
        ("rollout_sample_hook_path", "sample_hook_missing_sample"),
        ("rollout_all_samples_process_path", "custom_rm"),
        ("custom_rollout_log_function_path", "log_missing_time"),
        ("custom_eval_rollout_log_function_path", "custom_rm"),
        ("custom_megatron_before_train_step_hook_path", "before_train_step_missing_scheduler"),
        ("custom_megatron_before_log_prob_hook_path", "custom_rm"),
    ],
)
def test_preflight_rejects_wrong_signature(arg, name):
    flag = "--" + arg.replace("_", "-")
    with pytest.raises(SlimeError, match=rf"^{flag} tests\.contracts\.hooks\.{name}: signature .* cannot be called as"):
        check_hook(arg, H + name)


@pytest.mark.parametrize("arg", sorted(HOOK_CALLS))
def test_preflight_names_import_errors(arg):
    flag = "--" + arg.replace("_", "-")
    with pytest.raises(
        SlimeError,
        match=rf"cannot import module 'tests.contracts.bad_import_hook' \(from {flag}\).*"
        "a_module_that_does_not_exist",
    ):
        check_hook(arg, "tests.contracts.bad_import_hook.hook")
    with pytest.raises(SlimeError, match=rf"has no attribute 'nope' \(from {flag}\)"):
        check_hook(arg, H + "nope")


def test_preflight_checks_every_hook_argument():
    args = make_args()
    check_hooks(args)  # the defaults (rollout function, data source) pass
    args.custom_rm_path = "tests.contracts.bad_import_hook.hook"
    with pytest.raises(SlimeError, match="--custom-rm-path"):
        check_hooks(args)


# ------------------------------------------------------------------ Data Buffer hooks


def _buffer_source(tmp_path, **kw):
    from slime.data.data_source import RolloutDataSourceWithBuffer

    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'{{"input": "q{i}"}}\n' for i in range(6)))
    args = make_args(prompt_data=str(path), input_key="input", n_samples_per_prompt=2, **kw)
    return RolloutDataSourceWithBuffer(args)


def test_buffer_filter_chooses_what_leaves_the_buffer(tmp_path):
    src = _buffer_source(tmp_path, buffer_filter_path=H + "buffer_filter_newest")
    src.add_samples(src.get_samples(3))  # groups 0, 1, 2 into the buffer
    src.rollout_id = 7
    hooks.CALLS["buffer_filter"] = []
    got = src.get_samples(4)
    assert [g[0].group_index for g in got] == [2, 1, 0, 3]  # newest buffered first, then a new prompt
    assert hooks.CALLS["buffer_filter"] == [7] and src.get_buffer_length() == 0


def test_buffer_filter_that_breaks_the_contract_is_named(tmp_path):
    src = _buffer_source(tmp_path, buffer_filter_path=H + "buffer_filter_keeps_groups")
    src.add_samples(src.get_samples(2))
    with pytest.raises(
        SlimeError,
        match="--buffer-filter-path tests.contracts.hooks.buffer_filter_keeps_groups must remove the groups it returns",
    ):
        src.get_samples(2)


def test_add_samples_rejects_a_partial_group(tmp_path):
    src = _buffer_source(tmp_path)
    with pytest.raises(SlimeError, match=r"--n-samples-per-prompt \(2\) samples, got 1"):
        src.add_samples([src.get_samples(1)[0][:1]])


def test_rollout_sample_filter_zeroes_the_loss_of_removed_samples():
    g = group(4)
    for s in g:
        s.reward, s.status, s.tokens, s.response_length, s.loss_mask = (
            1.0,
            Sample.Status.COMPLETED,
            [1, 2, 3],
            2,
            [1, 1],
        )
    hooks.remove_odd_samples(make_args(), g)
    data = samples_to_train_data(make_args(n_samples_per_prompt=4), [g])
    assert data["loss_masks"] == [[1, 1], [0, 0], [1, 1], [0, 0]] and len(data["tokens"]) == 4
    from slime.rollout.train_data import rollout_metrics

    assert rollout_metrics(make_args(n_samples_per_prompt=4), [g], data)["rollout/removed_samples"] == 2.0


def test_custom_data_source_feeds_the_default_rollout(state):
    args = make_args(custom_generate_function_path=H + "custom_generate", custom_rm_path=H + "custom_rm")
    state(args)
    out = asyncio.run(sglang_rollout.generate_rollout_async(args, 0, hooks.ListDataSource(args)))
    assert [g[0].prompt for g in out.samples] == ["p0", "p1"]
    # no add_samples-capable buffer is needed when nothing is left over
    assert out.metrics["rollout/partial/discarded_groups"] == 0.0


# ------------------------------------------------------------------ --rollout-sample-hook-path (slime's append option)


def _fresh_calls(*keys):
    for key in keys:
        hooks.CALLS.pop(key, None)


def _hook_args(*paths, **kw):
    argv = [a for p in paths for a in ("--rollout-sample-hook-path", H + p)]
    return full_args(
        *argv,
        **{
            "rm_type": "math",
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 2,
            "custom_generate_function_path": H + "custom_generate",
            "custom_rm_path": H + "custom_rm",
            **kw,
        },
    )


@pytest.mark.parametrize("evaluation", [False, True])
def test_sample_hooks_run_in_order_on_each_sample_before_its_reward(state, evaluation):
    _fresh_calls("sample_hook", "sample_hook_kwargs")
    args = _hook_args("sample_hook", "sample_hook_replaces")
    assert args.rollout_sample_hook_path == [H + "sample_hook", H + "sample_hook_replaces"]
    state(args)
    sglang_rollout.set_current_rollout_id(5)
    out = run_group(args, group(3), evaluation=evaluation)
    assert [s.response for s in out] == ["gen-0!", "gen-1!", "gen-2!"]  # the second hook's replacement is kept
    assert all(s.metadata["hooks"] == ["first", "second"] for s in out)  # in the order given
    # slime's keywords; the reward is computed after the hooks (custom_rm: len of the hooked response)
    assert hooks.CALLS["sample_hook"] == [(i, 5, evaluation, None) for i in range(3)]
    assert [s.reward for s in out] == [6.0, 6.0, 6.0]
    assert hooks.CALLS["sample_hook_kwargs"] == [["evaluation", "rollout_id"]] * 3  # **kwargs gets both


def test_sample_hooks_in_generate_and_rm_and_on_every_sample_a_generate_function_returns(state):
    _fresh_calls("sample_hook")
    # slime scores the samples of one generate call in one batched reward call (group_rm: 0.0, 1.0, ...)
    args = _hook_args(
        "sample_hook", custom_generate_function_path=H + "custom_generate_list", custom_rm_path=H + "group_rm"
    )
    state(args)
    sglang_rollout.set_current_rollout_id(2)
    out = asyncio.run(sglang_rollout.generate_and_rm(args, group(1)[0], {"max_new_tokens": 4}))
    assert [s.metadata["hooks"] for s in out] == [["first"], ["first"]]
    assert [(c[0], c[1], c[3]) for c in hooks.CALLS["sample_hook"]] == [(0, 2, None), (100, 2, 0.25)]
    assert [s.reward for s in out] == [0.0, 0.25] and hooks.CALLS["group_rm"] == [1]


def test_a_sample_hook_without_keywords_gets_none(state):
    args = _hook_args("sample_hook_two_args")
    state(args)
    assert all(s.metadata["plain"] for s in run_group(args, group()))


def test_a_sample_hook_that_raises_fails_only_that_sample(state, caplog):
    _fresh_calls("sample_hook")
    args = _hook_args("sample_hook_raises_on_odd", "sample_hook")
    state(args)
    with caplog.at_level(logging.ERROR):
        out = run_group(args, group(4))
    ok, bad = [s for s in out if s.index % 2 == 0], [s for s in out if s.index % 2]
    assert all(s.status == Sample.Status.COMPLETED and s.reward == 5.0 for s in ok)
    assert all(s.status == Sample.Status.FAILED and s.reward is None for s in bad)  # not scored
    assert "--rollout-sample-hook-path tests.contracts.hooks.sample_hook_raises_on_odd" in bad[0].metadata["error"]
    assert "hook refused sample 1" in bad[0].metadata["error"] and "Traceback" not in caplog.text
    assert [c[0] for c in hooks.CALLS["sample_hook"]] == [0, 2]  # later hooks skip a failed sample
    assert len(bad[0].loss_mask) == bad[0].response_length  # well-formed, never trained on


def test_a_sample_hook_returning_something_else_fails_the_sample(state):
    args = _hook_args("sample_hook_wrong_type")
    state(args)
    out = run_group(args, group())
    assert all(s.status == Sample.Status.FAILED and "not a Sample or None" in s.metadata["error"] for s in out)


def test_the_default_rollout_tells_sample_hooks_its_rollout_id(state):
    _fresh_calls("sample_hook")
    args = _hook_args("sample_hook")
    state(args)
    asyncio.run(sglang_rollout.generate_rollout_async(args, 7, Source()))
    assert {c[1] for c in hooks.CALLS["sample_hook"]} == {7} and len(hooks.CALLS["sample_hook"]) == 4


# ------------------------------------------------------------------ --rollout-all-samples-process-path


def test_all_samples_process_sees_every_finished_group_dropped_ones_included(state, monkeypatch):
    _fresh_calls("all_samples")
    rewards = iter([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0] + [1.0] * 100)
    examined = []

    async def rm(args, sample):
        return next(rewards)

    def recording_filter(args, samples):  # the filter sees each finished group once: the reference
        examined.append([(s.group_index, s.index, s.reward) for s in samples])
        return hooks.keep_if_first_reward_positive(args, samples)

    monkeypatch.setattr(hooks, "custom_rm", rm)
    monkeypatch.setattr(hooks, "recording_filter", recording_filter, raising=False)
    args = make_args(
        custom_generate_function_path=H + "custom_generate",
        custom_rm_path=H + "custom_rm",
        dynamic_sampling_filter_path=H + "recording_filter",
        over_sampling_batch_size=1,
        rollout_all_samples_process_path=H + "all_samples_process",
    )
    state(args)
    source = Source()
    out = asyncio.run(sglang_rollout.generate_rollout_async(args, 0, source))
    seen, passed_source = hooks.CALLS["all_samples"]
    assert passed_source is source
    assert seen == sorted(examined, key=lambda g: g[0][1])  # every examined group, by first sample index
    dropped = [g for g in examined if g[0][2] <= 0]
    assert len(dropped) == out.metrics["rollout/dynamic_filter/drop_bad_first"] == 2
    assert all(g in seen for g in dropped)
    assert [[(s.group_index, s.index, s.reward) for s in g] for g in out.samples] == [g for g in seen if g[0][2] > 0]


def test_all_samples_process_error_stops_the_rollout_naming_it(state):
    args = make_args(
        custom_generate_function_path=H + "custom_generate",
        custom_rm_path=H + "custom_rm",
        rollout_all_samples_process_path=H + "all_samples_process_raises",
    )
    state(args)
    with pytest.raises(
        SlimeError,
        match=r"rollout 3: --rollout-all-samples-process-path "
        r"tests.contracts.hooks.all_samples_process_raises raised ValueError: "
        r"bookkeeping failed",
    ):
        asyncio.run(sglang_rollout.generate_rollout_async(args, 3, Source()))


def test_preflight_checks_each_sample_hook_of_the_list():
    args = _hook_args("sample_hook", "sample_hook_missing_sample")
    with pytest.raises(
        SlimeError, match=r"--rollout-sample-hook-path tests\.contracts\.hooks\.sample_hook_missing_sample"
    ):
        check_hooks(args)
    check_hooks(_hook_args("sample_hook", "sample_hook_replaces"))
