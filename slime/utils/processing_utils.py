"""slime's `slime.utils.processing_utils`: what user hooks call to load a model's tokenizer and,
for multimodal models, its processor."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer


def load_tokenizer(name_or_path: str, **kwargs: Any):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` (a local directory here)."""
    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any):
    """The model's multimodal processor; None for a text-only model (where transformers has no
    processor, or would hand back the tokenizer alone), as in slime."""
    # Imported here: transformers' processor machinery (image processing, distributed tensors) adds
    # ~2 s to the start of every process that imports the rollout side; text models never need it.
    from transformers import AutoProcessor, ProcessorMixin

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError):
        return None
    return processor if isinstance(processor, ProcessorMixin) else None
