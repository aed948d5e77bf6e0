"""Hooks used by the end-to-end tests (loaded by dotted path, as a user's would be)."""


async def digit_reward(args, sample) -> float:
    """Fraction of response characters that are digits: varied even for a random model,
    so GRPO gets a non-zero advantage (the bundled `math` reward is all zeros before SFT)."""
    text = sample.response or ""
    return sum(c.isdigit() for c in text) / max(1, len(text))
