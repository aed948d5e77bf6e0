"""Hooks used by the end-to-end tests (loaded by dotted path, as a user's would be)."""


async def digit_reward(args, sample) -> float:
    """Fraction of response characters that are digits: varied even for a random model,
    so GRPO gets a non-zero advantage (the bundled `math` reward is all zeros before SFT)."""
    text = sample.response or ""
    return sum(c.isdigit() for c in text) / max(1, len(text))


async def seeded_generate(args, sample, sampling_params):
    """The default generate with a sampling seed per sample (--rollout-seed + its global index): a
    rollout run again after a resume samples the same tokens from the same weights."""
    from slime.rollout.sglang_rollout import generate

    return await generate(args, sample, {**sampling_params, "sampling_seed": args.rollout_seed + sample.index})


async def flaky_digit_reward(args, sample) -> float:
    """`digit_reward`, but the reward service "fails" for 1 sample in 10 (index 3, 13, 23, ...)."""
    if sample.index % 10 == 3:
        raise RuntimeError(f"reward service unavailable for sample {sample.index}")
    return await digit_reward(args, sample)
