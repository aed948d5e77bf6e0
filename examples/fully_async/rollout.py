"""The example's rollout function: the library's `slime.rollout.fully_async_rollout` (slime's
path), kept under this name for launch scripts written against the example."""

from slime.rollout.fully_async_rollout import generate_rollout, generate_rollout_fully_async

__all__ = ["generate_rollout", "generate_rollout_fully_async"]
