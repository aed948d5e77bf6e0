"""--share-prompt-forward: the samples of one prompt run it once (its keys and values indexed out to
each of them). Checked against one plain forward per sample computed here: the logits of every
response position, the parameters' gradients, and a real TrainActor's steps and weights."""

from __future__ import annotations

import random

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.batching import _can_share_prompts, _repeated_prompts, build_micro_batch


def _grouped(seed: int = 0) -> dict:
    """Prompts of different lengths, 1-4 samples each, interleaved (sharing must not rely on order),
    responses of 1-6 tokens with masks and rewards."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 7, 5, 2)]
    owners = [0, 1, 0, 2, 1, 0, 3, 1, 0, 2]
    data: dict = {"tokens": [], "response_lengths": [], "loss_masks": [], "rewards": [], "rollout_log_probs": []}
    for i, p in enumerate(owners):
        r = 1 if i == 4 else rng.randint(1, 6)
        data["tokens"].append(prompts[p] + [rng.randrange(3, 300) for _ in range(r)])
        data["response_lengths"].append(r)
        data["loss_masks"].append([rng.randint(0, 1) for _ in range(r - 1)] + [1])
        data["rewards"].append(rng.uniform(-1, 1))
        data["rollout_log_probs"].append([-rng.uniform(3, 7) for _ in range(r)])
    return data


def test_repeated_prompts_are_found_by_their_tokens():
    data = _grouped()
    of = _repeated_prompts(data["tokens"], data["response_lengths"])
    assert of.tolist() == [0, 1, 0, 2, 1, 0, 3, 1, 0, 2]
    # a response token that equals the next prompt token does not make two prompts one: split by lengths
    assert _repeated_prompts([[1, 2, 3], [1, 2, 3]], [1, 2]) is None
    assert _repeated_prompts([[1, 2, 3], [4, 2, 3]], [1, 1]) is None  # nothing repeats: the plain forward
    assert _repeated_prompts([[1, 2, 3], [1, 2]], [1, 0]) is None  # an empty response: the plain forward
    mb = build_micro_batch(data, range(10), packed=False, share_prompts=True)
    assert mb.prompt_of is not None
    assert build_micro_batch(data, range(10), packed=False).prompt_of is None  # off
    assert build_micro_batch(data, range(10), packed=True, share_prompts=True).prompt_of is None  # packed: no


def test_logits_and_gradients_equal_one_forward_per_sample(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert _can_share_prompts(model)
    data = _grouped(1)
    indices = [9, 0, 1, 2, 4, 5, 6, 7, 8]  # leaves sample 3 out: prompt 2 has one sample here
    mb = build_micro_batch(data, indices, packed=False, share_prompts=True)
    plain = build_micro_batch(data, indices, packed=False)
    weights = torch.randn(sum(mb.response_lengths), model.config.vocab_size, generator=torch.Generator().manual_seed(0))

    def run(batch):
        model.zero_grad()
        logits = batch.response_logits(model)
        (logits * weights).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    shared, g_shared = run(mb)
    # the reference: each sample alone, the full output at the positions that predict its response
    rows = []
    for i in indices:
        ids = torch.tensor([data["tokens"][i]])
        r = data["response_lengths"][i]
        rows.append(model(input_ids=ids).logits[0, ids.shape[1] - r - 1 : ids.shape[1] - 1])
    model.zero_grad()
    reference = torch.cat(rows)
    (reference * weights).sum().backward()
    g_reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.testing.assert_close(shared, reference.detach(), rtol=1e-5, atol=1e-5)
    for name, g in g_reference.items():
        scale = float(g.abs().max())  # float rounding: summed over positions in another order
        torch.testing.assert_close(g_shared[name], g, rtol=1e-4, atol=1e-5 * scale, msg=name)
    padded, _ = run(plain)  # and the plain padded batch agrees with both
    torch.testing.assert_close(padded, shared, rtol=1e-5, atol=1e-5)


def test_not_shared_while_gradient_checkpointing(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from slime.backends.torch.models import enable_activation_checkpointing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    enable_activation_checkpointing(model)
    assert not _can_share_prompts(model)  # transformers would turn the cache off
    mb = build_micro_batch(_grouped(), range(10), packed=False, share_prompts=True)
    with torch.no_grad():
        model.eval()
        assert mb.response_logits(model).shape[0] == sum(mb.response_lengths)


def _actor(model_dir, run_dir, share: bool) -> TrainActor:
    args = parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--run-dir",
            str(run_dir),
            "--rollout-batch-size",
            "5",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "2",
            "--lr",
            "1e-3",
            "--micro-batch-size",
            "5",
            "--global-batch-size",
            "10",
            "--adam-eps",
            "1e-2",
            "--entropy-coef",
            "0.01",
            "--share-prompt-forward" if share else "--no-share-prompt-forward",
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor


def test_a_train_actor_takes_the_same_steps_either_way(tiny_model_dir, tmp_path):
    on, off = _actor(tiny_model_dir, tmp_path / "on", True), _actor(tiny_model_dir, tmp_path / "off", False)
    for rollout_id in range(2):
        m_on, m_off = on.train(rollout_id, _grouped(rollout_id)), off.train(rollout_id, _grouped(rollout_id))
        keys = sorted(k for k in m_off if not k.startswith("perf/"))
        assert "train/pg_loss" in keys and "train/entropy_loss" in keys
        for key in keys:
            assert m_on[key] == pytest.approx(m_off[key], rel=1e-4, abs=1e-6), (rollout_id, key)
    a, b = on.full_state_dict(), off.full_state_dict()
    assert any(
        not torch.equal(a[k], v) for k, v in _actor(tiny_model_dir, tmp_path / "fresh", True).full_state_dict().items()
    )  # the steps changed the weights
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


def test_one_token_responses_need_no_second_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    data = {"tokens": [[5, 6, 7, 8], [5, 6, 7, 9], [4, 6, 10]], "response_lengths": [1, 1, 1], "loss_masks": [[1]] * 3}
    mb = build_micro_batch(data, range(3), packed=False, share_prompts=True)
    assert mb.prompt_of.tolist() == [0, 0, 1]
    with torch.no_grad():
        torch.testing.assert_close(
            mb.response_logits(model),
            build_micro_batch(data, range(3), packed=False).response_logits(model),
            rtol=1e-5,
            atol=1e-5,
        )
