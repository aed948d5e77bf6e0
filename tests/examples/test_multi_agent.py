"""examples/multi_agent: grouping and bookkeeping, one rollout against a real engine, one real run."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from examples.multi_agent import rollout as ma  # noqa: E402
from slime.errors import SlimeError  # noqa: E402
from slime.utils.types import Sample  # noqa: E402
from tests.helpers import make_args  # noqa: E402

ROLES = [a.role for a in ma.AGENTS]


def _output(ids: list[int], finish: str = "stop", version: str | None = "3") -> dict:
    """One `/generate` answer in the engine's format (slime/engine/request.py result_of)."""
    meta = {
        "finish_reason": {"type": finish},
        "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(ids)],
    }
    if version is not None:
        meta["weight_version"] = version
    return {"text": "x" * len(ids), "output_ids": ids, "meta_info": meta}


# ------------------------------------------------------------------------------------ pure logic
def test_prompts_per_rollout_needs_a_multiple_of_the_agents():
    assert ma.prompts_per_rollout(make_args(rollout_batch_size=6)) == 2
    with pytest.raises(SlimeError, match=r"--rollout-batch-size 8 must be a multiple of the number of agents, 3"):
        ma.prompts_per_rollout(make_args(rollout_batch_size=8))


def test_turn_sample_keeps_engine_tokens_and_derives_unique_indices():
    base = Sample(group_index=5, index=11, prompt="1+2=", label="3", metadata={"k": 1})
    s = ma.turn_sample(base, "reviewer", 1, 3, "<ctx>", [7, 8, 9], _output([4, 5], finish="length"))
    assert s.tokens == [7, 8, 9, 4, 5] and s.response_length == 2 and s.prompt_length == 3
    assert s.loss_mask == [1, 1] and s.rollout_log_probs == [-0.5, -1.5]
    assert s.status == Sample.Status.TRUNCATED and s.weight_versions == ["3"]
    assert (s.group_index, s.index) == (5 * 3 + 1, 11 * 3 + 1)
    assert s.metadata == {"k": 1, "role": "reviewer", "prompt_group_index": 5, "prompt_index": 11}
    assert base.metadata == {"k": 1}  # the data source's sample is not touched
    assert ma.turn_sample(base, "solver", 0, 3, "", [1], _output([2], version=None)).weight_versions == []
    assert ma.turn_sample(base, "solver", 0, 3, "", [1], _output([2], "abort")).status == Sample.Status.ABORTED
    with pytest.raises(SlimeError, match="log-probs"):
        bad = _output([2, 3])
        bad["meta_info"].pop("output_token_logprobs")
        ma.turn_sample(base, "solver", 0, 3, "", [1], bad)


def test_failed_prompt_keeps_one_group_per_agent_with_n_samples():
    base = [Sample(group_index=2, index=4 + j, prompt="1+2=", label="3") for j in range(4)]
    groups = ma.failed_groups(base, [1, 2], RuntimeError("boom"))
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    for r, g in enumerate(groups):
        for s in g:
            assert s.status == Sample.Status.FAILED and s.metadata["role"] == ROLES[r]
            assert s.response_length == 0 and s.loss_mask == [] and s.tokens == [1, 2]
            assert "boom" in s.metadata["error"]
    assert len({s.index for g in groups for s in g}) == 12


def test_metrics_per_agent():
    args = make_args(n_samples_per_prompt=2)
    groups = []
    for r, role in enumerate(ROLES):
        g = []
        for j in range(2):
            s = Sample(
                response_length=r + 1,
                loss_mask=[1] * (r + 1),
                reward=float(j),
                status=Sample.Status.TRUNCATED if j else Sample.Status.COMPLETED,
                metadata={"role": role},
            )
            if role == "solver":
                s.metadata["own_reward"] = 1.0
            g.append(s)
        groups.append(g)
    groups[1][0].status = Sample.Status.FAILED  # not trainable: its tokens are not counted
    m = ma.multi_agent_metrics(args, groups)
    p = ma.METRIC_PREFIX
    assert m[f"{p}/solver_response_len"] == 1 and m[f"{p}/finalizer_response_len"] == 3
    assert m[f"{p}/reviewer_trainable_tokens"] == 2 and m[f"{p}/finalizer_trainable_tokens"] == 6
    assert m[f"{p}/solver_truncated_ratio"] == 0.5 and m[f"{p}/solver_num_samples"] == 2
    assert m[f"{p}/team_reward"] == 0.5 and m[f"{p}/solver_own_reward"] == 1.0 and m[f"{p}/num_prompts"] == 1


# ------------------------------------------------------------------------------------ real engine
# (the `engine` fixture, a real engine server, is in tests/examples/conftest.py)


def _args(tiny_model_dir, task_dir, engine, *extra: str) -> Namespace:
    from slime.arguments import parse_args

    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    return parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rm-type",
            "math",
            "--rollout-batch-size",
            "6",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "6",
            "--global-batch-size",
            "12",
            "--num-rollout",
            "1",
            "--rollout-function-path",
            "examples.multi_agent.rollout.generate_rollout",
            "--sglang-router-ip",
            host,
            "--sglang-router-port",
            port,
            *extra,
        ]
    )


@pytest.fixture
def fresh_state():
    from slime.rollout.sglang_rollout import GenerateState

    GenerateState.reset()
    yield
    GenerateState.reset()


def test_rollout_against_real_engine(tiny_model_dir, task_dir, engine, fresh_state):
    from transformers import AutoTokenizer

    from slime.data.data_source import RolloutDataSource

    args = _args(tiny_model_dir, task_dir, engine)
    ds = RolloutDataSource(args)
    out = ma.generate_rollout(args, 0, ds)
    groups = out.samples
    assert len(groups) == args.rollout_batch_size and all(len(g) == args.n_samples_per_prompt for g in groups)
    assert ds.group_counter == 2  # rollout_batch_size / 3 prompts were fetched
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for p in range(2):
        solver, reviewer, finalizer = groups[3 * p : 3 * p + 3]
        assert [g[0].metadata["role"] for g in (solver, reviewer, finalizer)] == ROLES
        problem = solver[0].prompt
        for j in range(2):
            team = (solver[j], reviewer[j], finalizer[j])
            assert len({s.metadata["prompt_group_index"] for s in team}) == 1
            assert len({s.reward for s in team}) == 1  # the team reward, shared
            for s in team:
                assert len(s.rollout_log_probs) == s.response_length == len(s.loss_mask) and all(s.loss_mask)
                assert s.tokens[: s.prompt_length] == tok(s.prompt, add_special_tokens=False)["input_ids"]
                assert s.weight_versions == ["0"]
            shown = ma.visible_text(tok, solver[j].tokens[solver[j].prompt_length :])
            assert (
                f"Proposed answer: {shown}\n" in reviewer[j].prompt
                and f"Proposed answer: {shown}\n" in finalizer[j].prompt
            )
            assert finalizer[j].prompt.startswith(problem.removesuffix("<|end|><|assistant|>"))
    assert out.metrics[f"{ma.METRIC_PREFIX}/finalizer_num_samples"] == 4
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_bad_arguments_are_named(tiny_model_dir, task_dir, engine, fresh_state):
    from slime.data.data_source import RolloutDataSource

    args = _args(tiny_model_dir, task_dir, engine)
    args.rollout_batch_size = 4
    with pytest.raises(SlimeError, match="--rollout-batch-size 4 must be a multiple"):
        ma.generate_rollout(args, 0, RolloutDataSource(args))
    args = _args(tiny_model_dir, task_dir, engine, "--apply-chat-template")
    with pytest.raises(SlimeError, match="without --apply-chat-template"):
        ma.generate_rollout(args, 0, RolloutDataSource(args))


def test_evaluation_is_the_solver_alone_with_the_chat_template(tiny_model_dir, task_dir, engine, fresh_state):
    args = _args(
        tiny_model_dir,
        task_dir,
        engine,
        "--eval-prompt-data",
        "arith",
        str(task_dir / "eval.jsonl"),
        "--eval-temperature",
        "0",
    )
    results = ma.generate_rollout(args, 0, None, evaluation=True)
    samples = results["arith"]["samples"]
    assert (
        len(samples) == 32 and samples[0].prompt.startswith("<|user|>") and samples[0].prompt.endswith("<|assistant|>")
    )
    assert args.apply_chat_template is False  # the caller's args are not changed


# ------------------------------------------------------------------------------------ real run
def record_trained(args, rollout_id, rollout_data) -> None:
    """--rollout-data-postprocess-path (trainer side): what the trainer is about to train on."""
    row = {
        "rollout_id": rollout_id,
        "num_samples": len(rollout_data["loss_masks"]),
        "trained_tokens": int(sum(sum(int(x) for x in m) for m in rollout_data["loss_masks"])),
    }
    with open(Path(args.run_dir) / "trained.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_short_training_run(ray_cluster, tiny_model_dir, task_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.train import train

    run_dir = tmp_path / "run"
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rm-type",
            "math",
            "--rollout-shuffle",
            "--rollout-function-path",
            "examples.multi_agent.rollout.generate_rollout",
            "--rollout-data-postprocess-path",
            "tests.examples.test_multi_agent.record_trained",
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "6",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "8",
            "--global-batch-size",
            "24",
            "--micro-batch-size",
            "24",
            "--lr",
            "1e-3",
            "--eval-interval",  # slime evaluates on an interval only
            "2",
            "--colocate",
            "--run-dir",
            str(run_dir),
            "--eval-prompt-data",
            "arith",
            str(task_dir / "eval.jsonl"),
            "--eval-temperature",
            "0",
            "--skip-eval-before-train",
        ]
    )
    train(args)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]  # one row per rollout
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    assert [t["rollout_id"] for t in trained] == [0, 1]
    p = ma.METRIC_PREFIX
    for r, t in zip(rows, trained, strict=True):
        assert math.isfinite(r["rollout/raw_reward"]) and math.isfinite(r["train/pg_loss"])
        assert r["rollout/num_samples"] == 24 == t["num_samples"]  # 6 groups of 4: 2 prompts x 3 agents
        assert r[f"{p}/num_prompts"] == 2
        for role in ROLES:
            assert r[f"{p}/{role}_num_samples"] == 8 and r[f"{p}/{role}_trainable_tokens"] > 0
            assert r[f"{p}/{role}_response_len"] > 0
        # every agent's tokens reached the trainer
        assert t["trained_tokens"] == sum(r[f"{p}/{role}_trainable_tokens"] for role in ROLES)
    assert math.isfinite(rows[-1]["eval/arith"])
