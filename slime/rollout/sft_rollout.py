"""SFT as a rollout function (slime's `slime.rollout.sft_rollout.generate_rollout`).

Nothing is generated: each prompt sample holds a chat conversation (a messages list, loaded
without `--apply-chat-template`), turned into tokens and a loss mask as slime does it:
`slime.utils.mask_utils.MultiTurnLossMaskGenerator` with the strategy `--loss-mask-type` names
(qwen, the default, qwen3, qwen3_5, distill_qwen), the row's tools (`--tool-key`) passed to the
template. The mask is 1 on what the assistant said (its content and the tokens closing its turn,
unless the message has `"step_loss_mask": 0`) and 0 elsewhere; the "response" runs from the first
trained token to the end.

Use it with `--rollout-function-path slime.rollout.sft_rollout.generate_rollout`,
`--input-key messages`, `--n-samples-per-prompt 1` and the `sft` loss.

`tokenize_messages` is another derivation of the same mask (rendering prefixes of the whole
conversation, so any prefix-consistent template works); it is not slime's and the rollout does not
use it: on templates that render a message differently alone and in a conversation (Qwen3's
`<think>` handling, default system prompts) the two give different tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from slime.data.data_source import load_tokenizer
from slime.errors import SlimeError
from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.types import Sample

logger = logging.getLogger(__name__)
_TOKENIZERS: dict[str, Any] = {}
_GENERATORS: dict[tuple[int, str], MultiTurnLossMaskGenerator] = {}  # (id(tokenizer), --loss-mask-type)
_warned_kwargs = False


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    if not isinstance(text, str):  # some versions return a list for a batch of one
        text = text[0]
    return text


def _char_segments(tokenizer: Any, messages: list[dict], kwargs: dict) -> tuple[str, int, list[tuple[int, int, int]]]:
    """Render the conversation; return (text, prompt_chars, [(start, end, mask) over the response])."""
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise SlimeError(f"SFT conversation has no assistant message (roles: {roles})")
    first = roles.index("assistant")
    full = _render(tokenizer, messages, False, kwargs)

    def prefix_len(upto: int, gen_prompt: bool) -> int:
        text = _render(tokenizer, messages[:upto], gen_prompt, kwargs) if upto or gen_prompt else ""
        if not full.startswith(text):
            raise SlimeError(
                "the chat template does not render conversations prefix-consistently (rendering the first "
                f"{upto} messages{' with the generation prompt' if gen_prompt else ''} is not a prefix of the "
                "whole conversation), so the SFT loss mask cannot be derived from it"
            )
        return len(text)

    prompt_chars = prefix_len(first, True)
    segments: list[tuple[int, int, int]] = []
    pos = prompt_chars
    for i in range(first, len(messages)):
        end = prefix_len(i + 1, False)
        if roles[i] == "assistant":
            content_start = prompt_chars if i == first else prefix_len(i, True)
            if content_start > pos:
                segments.append((pos, content_start, 0))  # the `<|assistant|>` marker
            segments.append((content_start, end, 1))
        else:
            segments.append((pos, end, 0))
        pos = end
    if pos < len(full):  # anything the template appends after the last message
        segments.append((pos, len(full), 0))
    return full, prompt_chars, segments


def tokenize_messages(
    tokenizer: Any, messages: list[dict], *, chat_template_kwargs: dict | None = None
) -> tuple[list[int], list[int], int]:
    """Tokens of the chat-templated conversation, the response's loss mask, and its length.

    The mask is derived by rendering prefixes of the conversation, so it follows whatever the
    template emits; `len(loss_mask) == response_length` and the response is `tokens[-response_length:]`.
    """
    kwargs = dict(chat_template_kwargs or {})
    text, prompt_chars, segments = _char_segments(tokenizer, messages, kwargs)

    def encode(s: str) -> list[int]:
        return list(tokenizer.encode(s, add_special_tokens=False))

    tokens = encode(text)
    # Token boundary of each character boundary: tokenize the prefix and check it is a prefix of
    # the whole (true whenever boundaries fall on special tokens, as in chat templates).
    cache: dict[int, int | None] = {}

    def token_pos(char_pos: int) -> int | None:
        if char_pos not in cache:
            if char_pos == len(text):
                cache[char_pos] = len(tokens)
            else:
                ids = encode(text[:char_pos])
                cache[char_pos] = len(ids) if tokens[: len(ids)] == ids else None
        return cache[char_pos]

    bounds = [prompt_chars] + [end for _, end, _ in segments]
    if all(token_pos(b) is not None for b in bounds):
        prompt_len = token_pos(prompt_chars)
        mask: list[int] = []
        for start, end, m in segments:
            mask.extend([m] * (token_pos(end) - token_pos(start)))
    else:
        prompt_len, mask = _mask_from_offsets(tokenizer, text, tokens, prompt_chars, segments)
    response_length = len(tokens) - prompt_len
    assert len(mask) == response_length
    return tokens, mask, response_length


def _mask_from_offsets(tokenizer, text, tokens, prompt_chars, segments) -> tuple[int, list[int]]:
    """Fallback when a segment boundary falls inside a token: use each token's character offset."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except Exception as e:
        raise SlimeError(
            "cannot align the SFT loss mask to tokens: a turn boundary falls inside a token and the "
            f"tokenizer gives no character offsets ({type(e).__name__}: {e})"
        ) from e
    if list(enc["input_ids"]) != tokens:
        raise SlimeError("cannot align the SFT loss mask to tokens: tokenizer calls disagree")
    # A token that straddles the end of the prompt joins the response (so the first content
    # characters are trained on); a response token is trained on if it overlaps a masked-in segment.
    prompt_len = sum(1 for _, e in offsets if e <= prompt_chars)
    mask = []
    for s, e in offsets[prompt_len:]:
        overlaps = any(seg_m and a < max(e, s + 1) and s < b for a, b, seg_m in segments)
        mask.append(1 if overlaps else 0)
    return prompt_len, mask


def _get_tokenizer(args: Any, data_source: Any) -> Any:
    tok = getattr(data_source, "tokenizer", None)  # RolloutDataSource loads it from --hf-checkpoint
    if tok is not None:
        return tok
    path = args.hf_checkpoint
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = load_tokenizer(path)
    return _TOKENIZERS[path]


def mask_generator(tokenizer: Any, loss_mask_type: str) -> MultiTurnLossMaskGenerator:
    """slime's generator for this tokenizer and `--loss-mask-type`, built once (it measures the template)."""
    key = (id(tokenizer), loss_mask_type)
    if key not in _GENERATORS:  # the generator holds the tokenizer, so its id is not reused meanwhile
        try:
            _GENERATORS[key] = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type=loss_mask_type)
        except Exception as e:
            raise SlimeError(
                f"--loss-mask-type {loss_mask_type}: the chat template of the tokenizer cannot be "
                f"measured ({type(e).__name__}: {e}); try another --loss-mask-type"
            ) from e
    return _GENERATORS[key]


def sft_tokens(
    generator: MultiTurnLossMaskGenerator, messages: list[dict], tools: list | None, where: str
) -> tuple[list[int], list[int], int]:
    """(tokens, the response's loss mask, response length) of one conversation, as slime's SFT rollout
    makes them: the response starts at the first trained token."""
    try:
        token_ids, loss_mask = generator.get_loss_mask(messages, tools=tools)
    except Exception as e:
        raise SlimeError(
            f"{where}: --loss-mask-type {generator.tokenizer_type} failed on this conversation "
            f"({type(e).__name__}: {e})"
        ) from e
    if len(token_ids) != len(loss_mask):
        raise SlimeError(
            f"{where}: --loss-mask-type {generator.tokenizer_type} gave {len(token_ids)} tokens "
            f"but {len(loss_mask)} loss-mask entries"
        )
    response_length = generator.get_response_lengths([loss_mask])[0]
    if response_length == 0:
        roles = [m.get("role") for m in messages]
        raise SlimeError(f"{where}: nothing to train on (no assistant turn with step_loss_mask 1; roles: {roles})")
    return list(token_ids), list(loss_mask[-response_length:]), response_length


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """Take `--rollout-batch-size` conversations and turn them into trainable samples."""
    global _warned_kwargs
    if evaluation:
        raise SlimeError(
            "the SFT rollout (slime.rollout.sft_rollout.generate_rollout) has no evaluation mode: "
            "unset --eval-interval or set --eval-function-path"
        )
    if not args.rollout_global_dataset:  # slime asserts it: the conversations are --prompt-data's
        raise SlimeError(
            "the SFT rollout takes its conversations from --prompt-data, which "
            "--disable-rollout-global-dataset does not load"
        )
    tokenizer = _get_tokenizer(args, data_source)
    generator = mask_generator(tokenizer, args.loss_mask_type)
    if args.apply_chat_template_kwargs and not _warned_kwargs:
        _warned_kwargs = True  # slime's SFT rollout renders with the template's defaults too
        logger.warning(
            "--apply-chat-template-kwargs %s is not used by the SFT rollout (as in slime): "
            "conversations are rendered by --loss-mask-type %s with the template's defaults",
            args.apply_chat_template_kwargs,
            args.loss_mask_type,
        )

    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            messages = sample.prompt
            if not isinstance(messages, list):
                raise SlimeError(
                    f"SFT sample {sample.index} has a {type(messages).__name__} prompt; SFT needs a list of chat "
                    "messages: point --input-key at the messages column and do not set --apply-chat-template"
                )
            tools = (sample.metadata or {}).get("tools")
            tokens, loss_mask, response_length = sft_tokens(generator, messages, tools, f"SFT sample {sample.index}")
            sample.tokens = tokens
            sample.response_length = response_length
            sample.loss_mask = loss_mask
            sample.response = tokenizer.decode(tokens[len(tokens) - response_length :])
            sample.reward = 0.0
            sample.status = Sample.Status.COMPLETED
    return groups
