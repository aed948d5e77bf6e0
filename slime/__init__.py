"""slime-rl: LLM post-training by reinforcement learning (slime's design, runnable on CPU)."""

import os

# Models and tokenizers are local directories; nothing is fetched from a hub. Set before any
# submodule imports transformers: huggingface_hub reads these once, at its own import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
