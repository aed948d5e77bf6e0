"""slime-rl: LLM post-training by reinforcement learning (slime's design, runnable on CPU)."""

__version__ = "0.1.0"
