"""Module paths slime users' hooks import exist here with slime's behaviour."""

from __future__ import annotations

from slime.utils.processing_utils import load_processor, load_tokenizer


def test_processing_utils_on_a_text_only_model(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.decode(tok.encode("12+3=15", add_special_tokens=False)) == "12+3=15"
    assert load_processor(str(tiny_model_dir)) is None  # text-only: no processor, as slime returns
