"""slime's rollout hooks and extra statistics: --rollout-max-context-len in the default generate
call (what is sent to the engine), --custom-rollout-log-function-path /
--custom-eval-rollout-log-function-path through the RolloutManager's own generate/eval, and
--log-passrate / --log-reward-category / --log-multi-turn / --log-correct-samples against
references written here (brute force over subsets, plain loops). No Ray, no engine."""

from __future__ import annotations

import asyncio
import itertools
import math
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from slime.arguments import build_parser, parse_args, startup_notes
from slime.errors import SlimeError
from slime.ray.rollout import RolloutManager
from slime.rollout import generation, sglang_rollout
from slime.rollout.train_data import eval_metrics, rollout_metrics, samples_to_train_data
from slime.utils.types import Sample
from tests.contracts import hooks
from tests.helpers import make_args, stub_generate_state

H = "tests.contracts.hooks."
BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]

# slime's definitions (slime/utils/arguments.py at 624b824a898ab0ec1fcb4d373004c7f3852bf515):
# option -> (dest, default, action kind, type)
SLIME_OPTIONS = {
    "--rollout-sample-hook-path": ("rollout_sample_hook_path", [], "append", None),
    "--rollout-all-samples-process-path": ("rollout_all_samples_process_path", None, "store", str),
    "--custom-rollout-log-function-path": ("custom_rollout_log_function_path", None, "store", str),
    "--custom-eval-rollout-log-function-path": ("custom_eval_rollout_log_function_path", None, "store", str),
    "--rollout-max-context-len": ("rollout_max_context_len", None, "store", int),
    "--log-multi-turn": ("log_multi_turn", False, "store_true", None),
    "--log-passrate": ("log_passrate", False, "store_true", None),
    "--log-reward-category": ("log_reward_category", None, "store", str),
    "--log-correct-samples": ("log_correct_samples", False, "store_true", None),
}


# ------------------------------------------------------------------ parsing


def test_options_have_slimes_dests_defaults_and_kinds():
    actions = {s: a for a in build_parser()._actions for s in a.option_strings}
    args = parse_args(BASE)
    for name, (dest, default, kind, type_) in SLIME_OPTIONS.items():
        a = actions[name]
        assert (a.dest, a.default, getattr(args, dest)) == (dest, default, default), name
        assert (
            type(a).__name__
            == {"append": "_AppendAction", "store": "_StoreAction", "store_true": "_StoreTrueAction"}[kind]
        ), name
        if kind != "store_true":
            assert a.type is type_ and a.nargs is None, name
    hooked = parse_args(BASE + ["--rollout-sample-hook-path", "a.b", "--rollout-sample-hook-path", "c.d"])
    assert hooked.rollout_sample_hook_path == ["a.b", "c.d"]
    assert parse_args(BASE).rollout_sample_hook_path == []  # the default list is not shared between parses


def test_built_options_are_no_longer_refused_or_named_unused():
    args = parse_args(
        BASE
        + [
            "--rollout-max-context-len",
            "64",
            "--rollout-all-samples-process-path",
            "a.b",
            "--custom-rollout-log-function-path",
            "a.b",
            "--custom-eval-rollout-log-function-path",
            "a.b",
            "--log-multi-turn",
            "--log-passrate",
            "--log-reward-category",
            "k",
            "--log-correct-samples",
        ]
    )
    assert startup_notes(args) == []


def test_context_length_sets_slimes_prompt_limit():
    assert parse_args(BASE + ["--rollout-max-context-len", "64"]).rollout_max_prompt_len == 63
    assert (
        parse_args(BASE + ["--rollout-max-context-len", "64", "--rollout-max-prompt-len", "10"]).rollout_max_prompt_len
        == 10
    )
    assert parse_args(BASE).rollout_max_prompt_len is None
    with pytest.raises(SlimeError, match="--rollout-max-prompt-len 64 must be < --rollout-max-context-len 64"):
        parse_args(BASE + ["--rollout-max-context-len", "64", "--rollout-max-prompt-len", "64"])
    with pytest.raises(SlimeError, match="--rollout-max-context-len must be >= 2"):
        parse_args(BASE + ["--rollout-max-context-len", "1"])


# ------------------------------------------------------------------ a GenerateState without tokenizer or engine


@pytest.fixture
def state(monkeypatch):
    yield lambda args: stub_generate_state(monkeypatch, args)
    sglang_rollout.GenerateState.reset()
    sglang_rollout.set_current_rollout_id(None)


# ------------------------------------------------------------------ --rollout-max-context-len


@pytest.fixture
def engine_calls(monkeypatch):
    """The default generate's HTTP call answered like the engine: as many tokens as max_new_tokens allows."""
    calls = []

    def answer(n):
        return {
            "text": "7" * n,
            "output_ids": [7] * n,
            "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 7]] * n},
        }

    async def fake_post(url, payload, *a, **kw):
        calls.append(payload)
        n = payload["sampling_params"]["max_new_tokens"]
        n = 5 if n is None else n  # "up to the context length": any length will do
        if isinstance(payload["input_ids"][0], list):
            return [answer(n) for _ in payload["input_ids"]]
        return answer(n)

    monkeypatch.setattr(generation, "post", fake_post)  # where the default generate posts
    return calls


def _fresh_group(prompt_len, n=2):
    return [
        Sample(group_index=0, index=j, prompt="p", tokens=list(range(1, prompt_len + 1)), metadata={}) for j in range(n)
    ]


@pytest.mark.parametrize(
    "context,max_response,prompt_len",
    [(10, None, 4), (10, 3, 4), (10, 8, 4), (None, 8, 4), (None, None, 4), (12, None, 11)],
)
def test_context_limit_bounds_max_new_tokens_of_a_fresh_group(state, engine_calls, context, max_response, prompt_len):
    opts = {"rm_type": "random", "n_samples_per_prompt": 2}
    if context:
        opts["rollout_max_context_len"] = context
    if max_response:
        opts["rollout_max_response_len"] = max_response
    args = make_args(**opts)
    state(args)
    group = asyncio.run(
        sglang_rollout.generate_and_rm_group(args, _fresh_group(prompt_len), dict(state(args).sampling_params))
    )
    limits = [x for x in (max_response, None if context is None else context - prompt_len) if x is not None]
    expected = min(limits) if limits else None
    assert [c["sampling_params"]["max_new_tokens"] for c in engine_calls] == [expected]
    for s in group:
        assert s.response_length == (5 if expected is None else expected)
        if context is not None:
            assert len(s.tokens) <= context


def test_no_room_left_is_truncated_without_a_request(state, engine_calls):
    args = make_args(rm_type="random", n_samples_per_prompt=2, rollout_max_context_len=6)
    state(args)
    group = asyncio.run(sglang_rollout.generate_and_rm_group(args, _fresh_group(6), dict(state(args).sampling_params)))
    assert engine_calls == []
    assert all(
        s.status == Sample.Status.TRUNCATED
        and s.tokens == list(range(1, 7))
        and s.response_length == 0
        and s.loss_mask == []
        for s in group
    )
    data = samples_to_train_data(args, [group])  # still well-formed train data
    assert data["response_lengths"] == [0, 0] and data["loss_masks"] == [[], []]


def test_a_resumed_partial_sample_fits_prompt_plus_response_so_far(state, engine_calls):
    # prompt 4 + 3 tokens from an earlier rollout: budget 8 - 3 = 5, room 10 - 7 = 3
    args = make_args(rm_type="random", rollout_max_context_len=10, rollout_max_response_len=8)
    state(args)
    s = Sample(
        group_index=0,
        index=0,
        prompt="p",
        tokens=[1, 2, 3, 4, 9, 9, 9],
        response="999",
        response_length=3,
        loss_mask=[1, 1, 1],
        rollout_log_probs=[-1.0] * 3,
        status=Sample.Status.ABORTED,
        metadata={},
    )
    out = asyncio.run(sglang_rollout.generate(args, s, dict(state(args).sampling_params)))
    assert engine_calls[0]["input_ids"] == [1, 2, 3, 4, 9, 9, 9]
    assert engine_calls[0]["sampling_params"]["max_new_tokens"] == 3
    assert len(out.tokens) == 10 and out.response_length == 6 and out.status == Sample.Status.TRUNCATED


def test_evaluation_uses_the_rollout_context_by_default(state, engine_calls):
    args = make_args(rm_type="random", rollout_max_context_len=9, n_samples_per_eval_prompt=2)
    state(args)
    params = sglang_rollout.sampling_params_from_args(args, evaluation=True)
    asyncio.run(sglang_rollout.generate_and_rm_group(args, _fresh_group(4), params, evaluation=True))
    assert engine_calls[0]["sampling_params"]["max_new_tokens"] == 5


# ------------------------------------------------------------------ custom log functions, through the RolloutManager


def _manager(args):
    mgr = RolloutManager.__ray_actor_class__(args, placement=None)
    mgr.load_hooks()
    return mgr


def _manager_args(**kw):
    return make_args(
        **{
            "rm_type": "math",
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 2,
            "data_source_path": H + "ListDataSource",
            "custom_generate_function_path": H + "custom_generate",
            "custom_rm_path": H + "custom_rm",
            **kw,
        }
    )


def test_custom_rollout_log_returning_true_replaces_the_default_metrics(state):
    hooks.CALLS.pop("rollout_log", None)
    args = _manager_args(custom_rollout_log_function_path=H + "log_rollout")
    state(args)
    data, metrics = _manager(args).generate(4)
    ((rid, indices, extra, rollout_time),) = hooks.CALLS["rollout_log"]
    assert rid == 4 and indices == [0, 1, 2, 3]  # slime's call: the flat list of samples
    assert extra["rollout/dynamic_filter/generated_groups"] == 2.0  # the rollout function's own metrics
    assert isinstance(rollout_time, float) and rollout_time > 0
    assert metrics == {"rollout/status/failed": 0.0}  # the default is skipped; failures are always counted
    assert len(data["tokens"]) == 4 and data["raw_reward"] == [5.0] * 4  # training is unaffected


def test_custom_rollout_log_returning_false_keeps_the_default_and_its_additions(state):
    args = _manager_args(custom_rollout_log_function_path=H + "log_rollout_and_keep_default")
    state(args)
    _, metrics = _manager(args).generate(0)
    assert metrics["custom/num_samples"] == 4.0 and metrics["rollout/raw_reward"] == 5.0
    assert "perf/rollout_time" in metrics


def test_custom_eval_log(state):
    hooks.CALLS.pop("eval_log", None)
    args = _manager_args(
        rollout_function_path=H + "rollout_function", custom_eval_rollout_log_function_path=H + "log_eval_rollout"
    )
    state(args)
    mgr = _manager(args)
    assert mgr.eval(3) == {"eval/set/failed": 0.0}
    assert hooks.CALLS["eval_log"] == [(3, ["set"], {"eval/x": 1.0})]
    default = _manager(_manager_args(rollout_function_path=H + "rollout_function")).eval(3)
    assert default["eval/set"] == 1.0 and default["eval/x"] == 1.0


def test_manager_metrics_carry_the_extra_statistics(state):
    args = _manager_args(log_passrate=True, log_multi_turn=True, log_correct_samples=True, rollout_max_response_len=8)
    state(args)
    _, metrics = _manager(args).generate(0)
    # custom_generate: 2 response tokens each; custom_rm: reward 5.0, so no sample is correct (== 1)
    assert metrics["passrate/pass@1"] == 0.0 and metrics["passrate/pass@2"] == 0.0
    assert metrics["multi_turn/raw_response_length/response_length_mean"] == 2.0
    assert metrics["multi_turn/raw_response_length/response_length_clip_ratio"] == 0.0
    assert not any(k.startswith("rollout/correct_") for k in metrics)


# ------------------------------------------------------------------ the statistics against references


def _brute_pass_at_k(rewards, k):
    """Fraction of the k-subsets of one prompt's samples that hold a correct (reward == 1) one."""
    subsets = list(itertools.combinations(rewards, k))
    return sum(any(r == 1 for r in sub) for sub in subsets) / len(subsets)


REWARDS = [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]  # 0.5 is not correct


def _groups(rewards=REWARDS, lengths=None, **sample_kw):
    groups = []
    for gi, rs in enumerate(rewards):
        g = []
        for j, r in enumerate(rs):
            n = lengths[gi][j] if lengths else 3
            g.append(
                Sample(
                    group_index=gi,
                    index=gi * len(rs) + j,
                    prompt="p",
                    tokens=[1] * (2 + n),
                    response="x" * n,
                    response_length=n,
                    loss_mask=[1] * n,
                    reward=r,
                    status=Sample.Status.COMPLETED,
                    metadata={},
                    **sample_kw,
                )
            )
        groups.append(g)
    return groups


def test_passrate_matches_brute_force():
    args = make_args(rm_type="math", n_samples_per_prompt=4, rollout_batch_size=3, log_passrate=True)
    groups = _groups()
    m = rollout_metrics(args, groups, samples_to_train_data(args, groups))
    for k in (1, 2, 4):
        want = sum(_brute_pass_at_k(rs, k) for rs in REWARDS) / len(REWARDS)
        assert m[f"passrate/pass@{k}"] == pytest.approx(want, abs=1e-12)
    assert "passrate/pass@3" not in m and "passrate/pass@8" not in m  # powers of two up to n, as slime's
    assert not any(
        k.startswith("passrate/")
        for k in rollout_metrics(make_args(rm_type="math"), groups, samples_to_train_data(args, groups))
    )


def test_passrate_with_one_sample_per_prompt_is_empty():
    args = make_args(rm_type="math", n_samples_per_prompt=1, log_passrate=True)
    groups = _groups([[1.0], [0.0]])
    assert not any(
        k.startswith("passrate/") for k in rollout_metrics(args, groups, samples_to_train_data(args, groups))
    )


def test_reward_categories_are_fractions_of_all_samples():
    cats = ["ok", "format", "format", "timeout", "ok", "ok", "format", "ok"]
    groups = _groups([[1.0] * 4, [1.0] * 4])
    for s, c in zip([s for g in groups for s in g], cats, strict=True):
        s.reward = {"score": 1.0, "why": c}
    groups[1][3].reward, groups[1][3].status = None, Sample.Status.FAILED  # a failed sample is in no category
    args = make_args(rm_type="math", n_samples_per_prompt=4, reward_key="score", log_reward_category="why")
    m = rollout_metrics(args, groups, samples_to_train_data(args, groups))
    got = {k: v for k, v in m.items() if k.startswith("rollout/error_cat/")}
    want = {}
    for c in cats[:7]:
        want[f"rollout/error_cat/{c}"] = want.get(f"rollout/error_cat/{c}", 0) + 1 / 8
    assert got == pytest.approx(want)


def test_multi_turn_statistics():
    groups = _groups([[0.0, 1.0], [1.0, 0.0]], lengths=[[4, 6], [2, 8]])
    masks = [[1, 1, 0, 1], [1, 0, 0, 0, 1, 1], [1, 1], [0, 1, 1, 1, 1, 1, 1, 1]]  # 0: tool output
    for s, m, r in zip([s for g in groups for s in g], masks, [3, 1, 2, 5], strict=True):
        s.loss_mask, s.metadata["round_number"] = m, r
    args = make_args(rm_type="math", n_samples_per_prompt=2, log_multi_turn=True, rollout_max_response_len=6)
    m = rollout_metrics(args, groups, samples_to_train_data(args, groups))
    raw, obs_free, rounds = [4, 6, 2, 8], [3, 3, 2, 7], [3, 1, 2, 5]
    p = "multi_turn/"
    assert m[p + "raw_response_length/response_length_mean"] == sum(raw) / 4
    assert (m[p + "raw_response_length/response_length_max"], m[p + "raw_response_length/response_length_min"]) == (
        8,
        2,
    )
    assert m[p + "raw_response_length/response_length_clip_ratio"] == 2 / 4  # 6 and 8 reach 6
    assert m[p + "wo_obs_response_length/response_length_mean"] == sum(obs_free) / 4
    assert (
        m[p + "wo_obs_response_length/response_length_max"],
        m[p + "wo_obs_response_length/response_length_min"],
    ) == (7, 2)
    assert m[p + "multi_turn_metric/round_number_mean"] == sum(rounds) / 4
    assert (m[p + "multi_turn_metric/round_number_max"], m[p + "multi_turn_metric/round_number_min"]) == (5, 1)


def test_correct_sample_statistics():
    lengths = [[1, 2, 3, 4], [5, 6, 8, 7]]
    rewards = [[1.0, 1.0, 0.0, 1.0], [1.0, 0.5, 1.0, 0.0]]
    groups = _groups(rewards, lengths=lengths)
    lps = {}
    for s in (s for g in groups for s in g):
        s.rollout_log_probs = [-0.1 * (s.index + 1) * (t + 1) for t in range(s.response_length)]
        s.loss_mask = [1] * (s.response_length - 1) + [0]  # the last token is not trained on
        lps[s.index] = s
    args = make_args(rm_type="math", n_samples_per_prompt=4, log_correct_samples=True, rollout_max_response_len=8)
    m = rollout_metrics(args, groups, samples_to_train_data(args, groups))
    correct = [s for s in lps.values() if s.reward == 1]
    assert [s.response_length for s in correct] == [1, 2, 4, 5, 8]
    # quarters of 8: (0, 2], (2, 4], (4, 6], (6, 8]
    quarter = [math.ceil(s.response_length / 2) for s in correct]
    for q, name in enumerate(("p25", "p50", "p75", "p100"), start=1):
        assert m[f"rollout/correct_length/{name}"] == pytest.approx(quarter.count(q) / len(correct))
    per_sample = []
    for s in correct:
        trained = [-lp for lp, keep in zip(s.rollout_log_probs, s.loss_mask, strict=True) if keep]
        per_sample.append(sum(trained) / len(trained) if trained else 0.0)
    assert m["rollout/correct_entropy"] == pytest.approx(sum(per_sample) / len(per_sample))


def test_eval_passrate_and_reward_categories():
    samples = [s for g in _groups() for s in g]
    for s, c in zip(samples, "abababababab", strict=True):
        s.reward = {"acc": s.reward, "cat": c}
    results = {"set": {"rewards": [r for rs in REWARDS for r in rs], "samples": samples}}
    args = make_args(rm_type="math", n_samples_per_eval_prompt=4, log_passrate=True, log_reward_category="cat")
    m = eval_metrics(args, results)
    for k in (1, 2, 4):
        assert m[f"eval/set-pass@{k}"] == pytest.approx(sum(_brute_pass_at_k(rs, k) for rs in REWARDS) / 3)
    assert m["eval/set/error_cat/a"] == m["eval/set/error_cat/b"] == 0.5
    plain = eval_metrics(make_args(rm_type="math", n_samples_per_eval_prompt=4), results)
    assert not any("-pass@" in k or "error_cat" in k for k in plain)
