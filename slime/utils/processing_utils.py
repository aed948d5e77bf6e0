"""slime's `slime.utils.processing_utils`: what user hooks call to load a model's tokenizer and,
for multimodal models, its processor, and `build_processor_kwargs` for calling that processor."""

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


def build_processor_kwargs(multimodal_inputs: dict | None = None) -> dict:
    """The keyword arguments of a processor call, as slime builds them: the multimodal inputs
    (images, videos, ...) plus per-modality options, text as plain lists (`text_kwargs`:
    `return_tensors=None`, no `mm_token_type_ids`) and each modality as PyTorch tensors
    (`audio_kwargs` / `images_kwargs` / `videos_kwargs`: `return_tensors="pt"`, over what the
    caller gave)."""
    kwargs = dict(multimodal_inputs) if multimodal_inputs else {}
    kwargs["text_kwargs"] = {**kwargs.get("text_kwargs", {}), "return_tensors": None, "return_mm_token_type_ids": False}
    for key in ("audio_kwargs", "images_kwargs", "videos_kwargs"):
        kwargs[key] = {**kwargs.get(key, {}), "return_tensors": "pt"}
    return kwargs
