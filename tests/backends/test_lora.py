"""LoRA on the trainer (`--enable-lora`): options, the merge against a hand computation and peft's own,
the reference as the base model, training only the adapter, exact resume, PEFT export."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slime.arguments import parse_args
from slime.backends.torch import checkpoint, lora
from slime.backends.torch.actor import TrainActor
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import commit
from tests.helpers import make_args

DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}
LORA = ["--enable-lora", "--lora-rank", "4", "--lora-alpha", "8"]


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


def _argv(tiny_model_dir, tmp_path, *extra):
    return [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--num-rollout",
        "3",
        "--lr",
        "1e-2",
        "--micro-batch-size",
        "2",
        "--run-dir",
        str(tmp_path),
        *extra,
    ]


def _actor(tiny_model_dir, tmp_path, *extra):
    args = parse_args(_argv(tiny_model_dir, tmp_path, *extra))
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor


def _plain(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0]


def _randomize_adapter(model, seed=0):
    """B = 0 at the start makes every merge trivial: give the adapter values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


# ------------------------------------------------------------------------------------ options
def test_options_as_slime_and_verl_name_them():
    off = make_args()
    assert off.enable_lora is False
    on = make_args("--enable-lora")
    assert (on.lora_rank, on.lora_alpha, on.lora_dropout, on.lora_target_modules) == (16, 32, 0.0, ["all-linear"])
    by_rank = make_args("--lora-rank", "8", "--target-modules", "q_proj,v_proj", "--exclude-modules", "v_proj")
    assert by_rank.enable_lora and by_rank.lora_rank == 8
    assert by_rank.lora_target_modules == ["q_proj", "v_proj"] and by_rank.lora_exclude_modules == ["v_proj"]
    assert make_args("--lora-rank", "0").enable_lora is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--enable-lora", "--lora-rank", "0"], "--enable-lora with --lora-rank 0"),
        (["--lora-rank", "-2"], "--lora-rank must be > 0"),
        (["--enable-lora", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
        (["--enable-lora", "--lora-alpha", "0"], "--lora-alpha must be > 0"),
        (["--enable-lora", "--only-train-params-name-list", "lm_head"], "only the adapter trains"),
        (["--enable-lora", "--ref-update-interval", "2"], "the reference is the base model"),
    ],
)
def test_bad_lora_options_stop_at_parse_time(argv, message):
    with pytest.raises(SlimeError, match=re.escape(message)):
        make_args(*argv)


def test_a_full_model_directory_is_not_an_adapter(tiny_model_dir):
    with pytest.raises(SlimeError, match="no adapter_config.json there .* a full model's directory is not an adapter"):
        make_args("--lora-adapter-path", str(tiny_model_dir))


def test_target_modules_that_match_nothing_name_the_models_linear_layers(tiny_model_dir):
    model = _plain(tiny_model_dir)
    assert set(lora.target_modules(model, ["all-linear"], [])) >= {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert "lm_head" not in lora.target_modules(model, ["all-linear"], [])
    with pytest.raises(SlimeError, match=r"qkv_proj match no linear layer .* its linear layers are .*q_proj"):
        lora.target_modules(model, ["qkv_proj"], [])


# ------------------------------------------------------------------------------------ the merge
def test_merge_is_w0_plus_alpha_over_r_b_a_and_gives_the_lora_models_logits(tiny_model_dir):
    model = _plain(tiny_model_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora.apply(model, make_args(*LORA, "--target-modules", "q_proj,down_proj"))
    _randomize_adapter(model)
    state = model.state_dict()
    merged = lora.merged(state, lora.scaling(model))
    assert set(merged) == set(base)  # the plain model's names, no adapter tensors
    # by hand: alpha / r = 8 / 4
    name = "model.layers.0.self_attn.q_proj"
    a, b = state[f"{name}.lora_A.default.weight"], state[f"{name}.lora_B.default.weight"]
    torch.testing.assert_close(merged[f"{name}.weight"], base[f"{name}.weight"] + 2.0 * (b @ a), rtol=0, atol=1e-6)
    assert torch.equal(merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"])
    # a plain model holding the merged weights computes what the LoRA model computes
    plain = _plain(tiny_model_dir)
    plain.load_state_dict(merged)
    tokens = [5, 6, 7, 8, 9, 10]
    torch.testing.assert_close(_logits(plain, tokens), _logits(model.eval(), tokens), rtol=0, atol=1e-5)


def test_merge_matches_pefts_own(tiny_model_dir):
    """peft's PeftModel.merge_and_unload of the same adapter gives the same weights."""
    from peft import LoraConfig, get_peft_model

    model = _plain(tiny_model_dir)
    lora.apply(model, make_args(*LORA, "--target-modules", "v_proj,up_proj"))
    _randomize_adapter(model, seed=1)
    ours = lora.merged(model.state_dict(), lora.scaling(model))
    peft_model = get_peft_model(
        _plain(tiny_model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "up_proj"])
    )
    with torch.no_grad():
        mine = dict(model.named_parameters())
        for n, p in peft_model.named_parameters():
            if ".lora_" in n:
                p.copy_(mine[n.removeprefix("base_model.model.")])
    theirs = peft_model.merge_and_unload().state_dict()
    for k, v in theirs.items():
        torch.testing.assert_close(ours[k], v, rtol=0, atol=1e-6, msg=k)


def test_reference_view_is_the_base_model_and_leaves_the_adapter_trainable(tiny_model_dir):
    model = _plain(tiny_model_dir)
    lora.apply(model, make_args(*LORA))
    _randomize_adapter(model)
    model.train()
    ref = lora.ReferenceView(model)
    assert list(ref.parameters()) == []  # no copy of the weights
    tokens = [5, 6, 7, 8, 9, 10]
    torch.testing.assert_close(ref(input_ids=torch.tensor([tokens])).logits[0], _logits(_plain(tiny_model_dir), tokens))
    assert model.training
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n
    }
    assert not torch.allclose(_logits(model.eval(), tokens), _logits(_plain(tiny_model_dir), tokens))


# ------------------------------------------------------------------------------------ training
def test_only_the_adapter_trains_and_kl_is_to_the_base(tiny_model_dir, tmp_path):
    actor = _actor(tiny_model_dir, tmp_path, *LORA, "--use-kl-loss", "--kl-loss-coef", "0.1")
    assert isinstance(actor.ref_model, lora.ReferenceView)
    optimized = {id(p) for g in actor.optimizer.param_groups for p in g["params"]}
    names = {n for n, p in actor.model.named_parameters() if id(p) in optimized}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    base = _plain(tiny_model_dir).state_dict()
    first = actor.train(0, _copy(DATA))
    # B = 0: the policy starts as the base model (float noise: the reference's forward keeps all logits)
    assert first["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    second = actor.train(1, _copy(DATA))
    assert second["train/kl_loss"] > 0.0
    state = lora.base_view(actor.model.state_dict())
    assert set(state) == set(base)
    for k, v in base.items():  # the base never moves
        assert torch.equal(state[k], v), k
    full = actor.full_state_dict()
    assert set(full) == set(base) and any(not torch.equal(full[k], base[k]) for k in base)
    # the reference's log-probs are the base model's
    ref_lp = actor._forward_only(_copy(DATA), [0, 1, 2, 3], actor.ref_model)
    plain = TrainActor.__new__(TrainActor)
    plain.__dict__.update(actor.__dict__, model=_plain(tiny_model_dir))
    base_lp = plain._forward_only(_copy(DATA), [0, 1, 2, 3], plain.model)
    for x, y in zip(ref_lp, base_lp, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_resume_is_exact_and_the_adapter_exports_in_peft_format(tiny_model_dir, tmp_path):
    from peft import PeftModel

    save = tmp_path / "ckpt"
    flags = [*LORA, "--save", str(save)]
    whole = _actor(tiny_model_dir, tmp_path / "whole", *flags)
    whole.train(0, _copy(DATA))
    whole.save(0)
    commit(str(save), 0)
    after_two = whole.train(1, _copy(DATA))

    resumed = _actor(tiny_model_dir, tmp_path / "resumed", *flags, "--load", str(save))
    again = resumed.train(1, _copy(DATA))
    assert again["train/pg_loss"] == after_two["train/pg_loss"]
    for k, v in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k

    # the adapter in PEFT's format: peft loads it onto the base, and it computes the merged HF files' logits
    adapter = save / "iter_0000000" / checkpoint.ADAPTER_DIR
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    peft_model = PeftModel.from_pretrained(_plain(tiny_model_dir), str(adapter)).eval()
    merged_files = _plain(save / "iter_0000000")
    tokens = [5, 6, 7, 8, 9, 10]
    torch.testing.assert_close(_logits(peft_model, tokens), _logits(merged_files, tokens), rtol=0, atol=1e-5)
    assert not torch.allclose(_logits(merged_files, tokens), _logits(_plain(tiny_model_dir), tokens))


def test_resume_refuses_a_full_fine_tune_and_another_base(tiny_model_dir, tmp_path):
    save = tmp_path / "full"
    full = _actor(tiny_model_dir, tmp_path / "a", "--save", str(save))
    full.save(0)
    commit(str(save), 0)
    with pytest.raises(SlimeError, match="has no LoRA adapter .* saved by a run without LoRA"):
        _actor(tiny_model_dir, tmp_path / "b", *LORA, "--load", str(save))

    save = tmp_path / "lora"
    run = _actor(tiny_model_dir, tmp_path / "c", *LORA, "--save", str(save))
    run.train(0, _copy(DATA))
    run.save(0)
    commit(str(save), 0)
    other = tmp_path / "other-base"
    shutil.copytree(tiny_model_dir, other)
    model = _plain(other)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.add_(0.01)
    model.save_pretrained(other)
    with pytest.raises(SlimeError, match="trained on another base model"):
        _actor(other, tmp_path / "d", *LORA, "--load", str(save))


def test_an_adapter_of_another_rank_is_refused_naming_both(tiny_model_dir, tmp_path):
    run = _actor(tiny_model_dir, tmp_path / "a", *LORA)
    adapter = tmp_path / "adapter"
    lora.save_adapter(run.model, adapter, run.model.state_dict(), "some/other-base")
    start = _actor(tiny_model_dir, tmp_path / "b", "--lora-adapter-path", str(adapter))
    assert start.args.lora_rank == 4 and start.args.lora_alpha == 8
    with pytest.raises(SlimeError, match="has rank 4, --lora-rank says 8"):
        make_args("--lora-adapter-path", str(adapter), "--lora-rank", "8")
    # a tensor of another shape (an adapter of a model of other sizes)
    from safetensors.torch import save_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("q_proj.lora_A.weight"))
    tensors[key] = torch.zeros(4, tensors[key].shape[1] + 1)
    other = tmp_path / "other-adapter"
    shutil.copytree(adapter, other)
    save_file(tensors, str(other / "adapter_model.safetensors"))
    with pytest.raises(SlimeError, match=r"adapter of some/other-base.*has shape"):
        _actor(tiny_model_dir, tmp_path / "c", "--lora-adapter-path", str(other))
    # same rank, other modules: names differ
    with pytest.raises(SlimeError, match="does not fit this model"):
        _actor(tiny_model_dir, tmp_path / "d", "--lora-adapter-path", str(adapter), "--target-modules", "q_proj")


@pytest.mark.parametrize(
    "extra",
    [["--bf16"], ["--recompute-granularity", "full"], ["--advantage-estimator", "ppo", "--critic-lr", "1e-3"]],
    ids=["bf16", "recompute", "ppo-critic"],
)
def test_lora_trains_under_bf16_recomputation_and_with_the_critic(tiny_model_dir, tmp_path, extra):
    actor = _actor(tiny_model_dir, tmp_path, *LORA, *extra)
    before = {n: p.detach().clone() for n, p in actor.model.named_parameters()}
    metrics = actor.train(0, _copy(DATA))
    assert metrics["train/grad_norm"] > 0
    moved = {n for n, p in actor.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(".lora_B." in n or ".lora_A." in n for n in moved)
    if actor.critic is not None:  # the critic is its own model, trained whole
        assert "train/value_loss" in metrics


def test_the_start_up_notes_say_what_lora_changes():
    from slime.arguments import startup_notes

    notes = " ".join(startup_notes(make_args(*LORA, "--use-kl-loss")))
    assert "LoRA: rank 4, alpha 8 (updates scaled by 2)" in notes
    assert "the reference policy (KL) is the base model: the policy with its adapter disabled, no second copy" in notes
    assert not any("LoRA" in n for n in startup_notes(make_args()))


def test_bf16_keeps_the_base_in_bf16_with_the_bits_of_an_fp32_base_under_autocast(
    tiny_model_dir, tmp_path, monkeypatch
):
    """--bf16: autocast rounds the frozen base weights to bf16 at every matmul, so storing them in bf16
    changes no bit of training; what leaves the trainer merged is fp32, merged from the bf16 base."""
    kept = _actor(tiny_model_dir, tmp_path / "bf16", *LORA, "--bf16")
    monkeypatch.setattr(lora, "store_base_weights_in", lambda model, dtype: None)
    fp32 = _actor(tiny_model_dir, tmp_path / "fp32", *LORA, "--bf16")
    params = dict(kept.model.named_parameters())
    assert {p.dtype for n, p in params.items() if ".base_layer.weight" in n} == {torch.bfloat16}
    assert {p.dtype for n, p in params.items() if ".base_layer." not in n} == {torch.float32}
    assert lora.has_reduced_base(kept.model) and not lora.has_reduced_base(fp32.model)
    for step in range(2):
        a, b = kept.train(step, _copy(DATA)), fp32.train(step, _copy(DATA))
        assert a["train/pg_loss"] == b["train/pg_loss"] and a["train/grad_norm"] == b["train/grad_norm"]
    other = dict(fp32.model.named_parameters())
    for n, p in params.items():
        if ".lora_" in n:
            assert torch.equal(p, other[n]), n
    merged, scale = kept.full_state_dict(), lora.scaling(kept.model)
    raw = kept.model.state_dict()
    for key in lora.adapted_modules(kept.model):
        w0 = raw[f"{key}.base_layer.weight"]
        a_, b_ = raw[f"{key}.lora_A.default.weight"], raw[f"{key}.lora_B.default.weight"]
        expect = w0.double() + scale * (b_.double() @ a_.double())
        assert merged[f"{key}.weight"].dtype == torch.float32
        torch.testing.assert_close(merged[f"{key}.weight"].double(), expect, rtol=0, atol=1e-6)
    # the weight-parity forward runs in the policy's own precision (no fp32 x bf16 matmul)
    from slime.backends.torch import step

    assert step.sequence_log_probs(kept, [5, 6, 7, 8]).shape == (3,)


def test_a_bf16_lora_checkpoint_resumes_only_in_bf16(tiny_model_dir, tmp_path):
    """Its merged weights are the bf16 base's: an fp32 run would see other weights, and says why.
    (The exact resume under --bf16, on 1 and 2 ranks: tests/backends/test_data_parallel.py.)"""
    save = tmp_path / "ckpt"
    run = _actor(tiny_model_dir, tmp_path / "a", *LORA, "--bf16", "--save", str(save))
    run.train(0, _copy(DATA))
    run.save(0)
    commit(str(save), 0)
    with pytest.raises(SlimeError, match="or with another of --bf16 / --fp16 / neither"):
        _actor(tiny_model_dir, tmp_path / "b", *LORA, "--load", str(save))
    assert _actor(tiny_model_dir, tmp_path / "c", *LORA, "--bf16", "--load", str(save)).model is not None
