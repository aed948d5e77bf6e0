"""`--load` refuses a checkpoint of another model or another run configuration before anything is
restored, naming each differing field with both values. The real actor and real checkpoints,
in-process. (That a checkpoint of the same configuration resumes exactly, with 1 and 2 ranks, is in
test_data_parallel.py; a whole run killed and resumed, Data Buffer and rollout id included, in
tests/e2e/test_crash_resume.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import commit

DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}


def _actor(model_dir, run_dir, *extra) -> TrainActor:
    args = parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "3",
            "--lr",
            "1e-3",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )
    return TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tmp_path_factory):
    """A grpo run's checkpoint of rollout 0 (all parameters trained)."""
    root = tmp_path_factory.mktemp("resume")
    actor = _actor(tiny_model_dir, root / "run", "--save", str(root / "ckpt"))
    actor.init()
    actor.train(0, {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in DATA.items()})
    actor.save(0)
    commit(root / "ckpt", 0)
    return root / "ckpt"


def test_the_same_configuration_resumes(tiny_model_dir, saved, tmp_path):
    assert _actor(tiny_model_dir, tmp_path, "--load", str(saved)).init() == 1


def test_another_model_architecture_is_refused_naming_the_field(tiny_model_dir, saved, tmp_path):
    """Same tensor shapes, another model (the RMSNorm epsilon): the weights would load silently."""
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(SlimeError) as e:
        _actor(other, tmp_path / "run", "--load", str(saved)).init()
    msg = str(e.value)
    assert f"--load {saved}" in msg and "another model" in msg
    assert "rms_norm_eps: checkpoint 1e-06, this run 1e-05" in msg
    assert "hidden_size" not in msg  # only what differs


def test_a_critic_run_does_not_resume_a_run_without_one(tiny_model_dir, saved, tmp_path):
    with pytest.raises(SlimeError) as e:
        _actor(tiny_model_dir, tmp_path, "--load", str(saved), "--advantage-estimator", "ppo").init()
    msg = str(e.value)
    assert "another configuration" in msg
    assert "critic (--advantage-estimator ppo): checkpoint False, this run True" in msg
    assert f"--hf-checkpoint {saved}" in msg  # how to start a new run from those weights instead


def test_other_trainable_parameters_are_refused_naming_them(tiny_model_dir, saved, tmp_path):
    """The optimizer state belongs to the parameters that trained when it was saved."""
    with pytest.raises(SlimeError) as e:
        _actor(tiny_model_dir, tmp_path, "--load", str(saved), "--freeze-params-name-list", "embed_tokens").init()
    msg = str(e.value)
    assert "trainable_parameters (--only-train-params-name-list / --freeze-params-name-list)" in msg
    assert "only in the checkpoint: model.embed_tokens.weight" in msg


def test_a_checkpoint_without_optimizer_state_resumes_with_other_trainable_parameters(tiny_model_dir, tmp_path):
    """--no-save-optim: no optimizer state to fit, so which parameters train may change (the critic may not)."""
    actor = _actor(tiny_model_dir, tmp_path / "run", "--save", str(tmp_path / "ckpt"), "--no-save-optim")
    actor.init()
    actor.save(0)
    commit(tmp_path / "ckpt", 0)
    frozen = ("--load", str(tmp_path / "ckpt"), "--freeze-params-name-list", "embed_tokens")
    resumed = _actor(tiny_model_dir, tmp_path / "run2", *frozen)
    assert resumed.init() == 1
    assert not resumed.model.get_input_embeddings().weight.requires_grad
