"""--load / --ref-load resolved as slime resolves them, on real directories: an empty --load starts
fresh, a Megatron torch_dist --ref-load of the same model is replaced by --hf-checkpoint's weights,
one of another model stops, naming both shapes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from slime.checkpoint_sources import resolve_checkpoints
from slime.errors import SlimeError
from tests.helpers import make_args


def _config(tiny_model_dir) -> dict:
    return json.loads((tiny_model_dir / "config.json").read_text())


def _torch_dist(path, vocab: int, hidden: int, layers: int, step: str = "12"):
    """A Megatron-LM style torch_dist checkpoint: tracker + iteration directory written by
    torch.distributed.checkpoint, with Megatron's GPT tensor names (layers stacked first)."""
    directory = path / ("release" if step == "release" else f"iter_{int(step):07d}")
    state = {
        "embedding.word_embeddings.weight": torch.zeros(vocab, hidden),
        "decoder.layers.self_attention.linear_proj.weight": torch.zeros(layers, hidden, hidden),
    }
    dcp.save(state, checkpoint_id=str(directory), no_dist=True)
    (path / "latest_checkpointed_iteration.txt").write_text(step)
    return path


def test_load_without_a_checkpoint_starts_fresh_from_ref_load(tiny_model_dir, tmp_path):
    args = make_args(
        "--hf-checkpoint", str(tiny_model_dir), "--load", str(tmp_path / "ckpt"), "--save", str(tmp_path / "ckpt")
    )
    notes = resolve_checkpoints(args, _config(tiny_model_dir))
    assert args.load is None and args.ref_load == str(tiny_model_dir)
    assert len(notes) == 1 and "holds no checkpoint yet: starting at rollout 0 from --ref-load" in notes[0]


def test_load_of_a_model_directory_is_explained(tiny_model_dir):
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--load", str(tiny_model_dir))
    with pytest.raises(SlimeError, match="is a Hugging Face model directory, not a checkpoint"):
        resolve_checkpoints(args, _config(tiny_model_dir))


@pytest.mark.parametrize("step", ["12", "release"])
def test_torch_dist_ref_load_of_the_same_model_uses_the_hf_weights(tiny_model_dir, tmp_path, step):
    cfg = _config(tiny_model_dir)
    padded = (cfg["vocab_size"] + 127) // 128 * 128  # Megatron pads the vocabulary
    ref = _torch_dist(tmp_path / "ref", padded, cfg["hidden_size"], cfg["num_hidden_layers"], step)
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--ref-load", str(ref))
    notes = resolve_checkpoints(args, cfg)
    assert args.ref_load == str(tiny_model_dir)
    assert len(notes) == 1 and "Megatron-LM torch_dist checkpoint" in notes[0] and "shapes match" in notes[0]


def test_torch_dist_ref_load_of_another_model_stops_naming_both(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir)
    ref = _torch_dist(tmp_path / "ref", cfg["vocab_size"], cfg["hidden_size"] * 2, cfg["num_hidden_layers"])
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--ref-load", str(ref))
    with pytest.raises(SlimeError) as e:
        resolve_checkpoints(args, cfg)
    assert f"{cfg['vocab_size']} x {cfg['hidden_size'] * 2}" in str(e.value)
    assert f"{cfg['vocab_size']} x {cfg['hidden_size']}" in str(e.value)
    deeper = _torch_dist(tmp_path / "deeper", cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"] + 1)
    with pytest.raises(SlimeError, match=f"it has {cfg['num_hidden_layers'] + 1} layers"):
        resolve_checkpoints(make_args("--hf-checkpoint", str(tiny_model_dir), "--ref-load", str(deeper)), cfg)


def test_a_checkpoint_of_this_layout_is_resumed(tiny_model_dir, tmp_path):
    from slime.utils.checkpoint_layout import commit
    from tests.utils.test_atomic_checkpoints import _stage

    ckpt = tmp_path / "ckpt"
    _stage(ckpt, 3)
    commit(ckpt, 3)
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--load", str(ckpt))
    assert resolve_checkpoints(args, _config(tiny_model_dir)) == [] and args.load == str(ckpt)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")  # a tracker naming nothing: stops
    with pytest.raises(SlimeError, match="iter_0000004 does not exist"):
        resolve_checkpoints(
            make_args("--hf-checkpoint", str(tiny_model_dir), "--load", str(ckpt)), _config(tiny_model_dir)
        )


def test_load_of_a_megatron_run_is_explained(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir)
    run = _torch_dist(tmp_path / "megatron_run", cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"])
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--load", str(run))
    with pytest.raises(SlimeError, match="holds a Megatron-LM torch_dist checkpoint \\(iter_0000012\\)"):
        resolve_checkpoints(args, cfg)
