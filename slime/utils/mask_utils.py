"""Token ids and loss mask of a chat conversation (slime's `slime.utils.mask_utils`).

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type).get_loss_mask(messages, tools)` returns
`(token_ids, loss_mask)`: the conversation as the chat template renders it, with 1 exactly on the
tokens the assistant produced (its content and the tokens that close its turn) and 0 on
everything else (system, user and tool turns, the assistant's turn header). A message with
`"step_loss_mask": 0` (anything but 1) is not trained on.

The per-template strategies are slime's:

* `qwen`: each message rendered alone; for every message after the first, the template's default
  system prompt (the tokens it puts before a lone non-system message) is cut off. A tokenizer with
  DeepSeek-R1's `<｜Assistant｜>` token is handled as `distill_qwen`.
* `qwen3`: each message rendered after (or, the first, before) a fixed probe message and the
  probe's tokens cut off, so templates that render a message by its neighbours (Qwen3's tool
  responses, merged into one user turn) come out right; consecutive tool messages go together.
* `qwen3_5`: the whole conversation rendered once; the mask is read from character offsets
  (a fast tokenizer is needed), from after `<|im_start|>assistant\\n` (and a leading `<think>\\n`)
  through `<|im_end|>` and its newline.
* `distill_qwen`: the first message with the generation prompt, then the last message's content
  tokenized alone, all of it trained on.
"""

from __future__ import annotations

from typing import Any

_PROBE_TEXT = "FOR TESTING ONLY"
_QWEN3_PROBE = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}
_DISTILL_ASSISTANT_TOKEN = "<｜Assistant｜>"
TOKENIZER_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    """Per mask: its length from the first 1 to the end (0 when nothing is trained on)."""
    return [len(mask) - mask.index(1) if 1 in mask else 0 for mask in loss_masks]


def _trained(message: dict) -> bool:
    return message.get("step_loss_mask", 1) == 1


class MultiTurnLossMaskGenerator:
    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen"):
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type
        self.system_message_length = 0
        self.gen_token_length = 0
        if tokenizer_type in ("qwen", "qwen3"):
            self.system_message_length, self.gen_token_length = self.get_system_message_length()

    # ---- helpers --------------------------------------------------------------------------------

    def _template_ids(self, messages: list[dict], **kwargs: Any) -> list[int]:
        """`apply_chat_template(..., tokenize=True)` as a plain list of ids, whatever the
        transformers version hands back (a list, a dict or a BatchEncoding)."""
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        if out and isinstance(out[0], list):  # a batch of one
            out = out[0]
        return [int(t) for t in out]

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return get_response_lengths(loss_masks)

    @staticmethod
    def find_all_sublist_indices(main_list: list, sublist: list) -> list[int]:
        """Every start index at which `sublist` occurs in `main_list` (overlaps included)."""
        n = len(sublist)
        return [i for i in range(len(main_list) - n + 1) if main_list[i : i + n] == sublist]

    def get_system_message_length(self) -> tuple[int, int]:
        """(tokens the template puts before a lone non-system message beyond its own turn header —
        the default system prompt, 0 when there is none; tokens of the generation prompt).

        Measured on two identical user turns: the distance between the probe text's two
        occurrences is one whole turn (header + text + footer); the footer is what follows the
        second one; so the header is known, and what precedes the first header is the system part.
        """
        probe = [{"role": "user", "content": _PROBE_TEXT}] * 2
        text_ids = self._encode(_PROBE_TEXT)
        rendered = self.tokenizer.apply_chat_template(probe, tokenize=False, add_special_tokens=False)
        ids = self._encode(rendered)
        found = self.find_all_sublist_indices(ids, text_ids)
        if len(found) != 2:
            raise ValueError(
                f"cannot measure the chat template: the probe text occurs {len(found)} times "
                f"in two rendered user turns (expected 2)"
            )
        first, second = found
        footer = len(ids) - second - len(text_ids)
        header = (second - first) - len(text_ids) - footer
        gen_tokens = len(self._template_ids(probe, add_special_tokens=False, add_generation_prompt=True)) - len(ids)
        return first - header, gen_tokens

    def _turn_mask(self, message: dict, n_tokens: int) -> list[int]:
        """An assistant turn is trained on after its generation-prompt header; other turns never."""
        if message["role"] != "assistant" or not _trained(message):
            return [0] * n_tokens
        return [0] * self.gen_token_length + [1] * (n_tokens - self.gen_token_length)

    # ---- strategies -----------------------------------------------------------------------------

    def gen_multi_turn_loss_mask_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        token_ids: list[int] = []
        loss_mask: list[int] = []
        for i, message in enumerate(messages):
            ids = self._template_ids([message], tools=tools) if i == 0 else self._template_ids([message])
            if i > 0 and message["role"] != "system":
                ids = ids[self.system_message_length :]  # the default system prompt a lone message gets
            token_ids += ids
            loss_mask += self._turn_mask(message, len(ids))
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_qwen3(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        probe_ids = self._template_ids([_QWEN3_PROBE])
        token_ids: list[int] = []
        loss_mask: list[int] = []
        i = 0
        while i < len(messages):
            message = messages[i]
            end = i + 1
            if message["role"] == "tool":  # Qwen templates put consecutive tool answers in one user turn
                while end < len(messages) and messages[end]["role"] == "tool":
                    end += 1
            chunk = messages[i:end]
            if i == 0:
                ids = self._template_ids(chunk + [_QWEN3_PROBE], tools=tools)[: -len(probe_ids)]
            else:
                ids = self._template_ids([_QWEN3_PROBE] + chunk)[len(probe_ids) :]
            if i > 0 and message["role"] != "system":
                ids = ids[self.system_message_length :]
            token_ids += ids
            loss_mask += self._turn_mask(message, len(ids))
            i = end
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_qwen3_5(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, tools=tools, return_dict=False)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        token_ids = list(enc["input_ids"])
        offsets = enc.get("offset_mapping")
        if offsets is None:
            raise ValueError(
                "Qwen3.5 loss mask generation requires a fast tokenizer with `return_offsets_mapping` support."
            )
        if token_ids != self._template_ids(messages, tools=tools):
            raise ValueError(
                "Qwen3.5 rendered text tokenization does not match `apply_chat_template(..., tokenize=True)` output."
            )

        header, think, end_marker = "<|im_start|>assistant\n", "<think>\n", "<|im_end|>"
        trained = [False] * len(text)  # per character
        cursor = 0
        for message in messages:
            if message["role"] != "assistant":
                continue
            start = text.find(header, cursor)
            if start < 0:
                raise ValueError("Failed to locate assistant message in rendered Qwen3.5 chat template output.")
            content = start + len(header)
            stop = text.find(end_marker, content)
            if stop < 0:
                raise ValueError("Failed to locate <|im_end|> for assistant message in rendered text.")
            stop += len(end_marker)
            if text[stop : stop + 1] == "\n":
                stop += 1
            cursor = stop
            if not _trained(message):
                continue
            if text.startswith(think, content):  # the template's own opening of the thought
                content += len(think)
            for pos in range(content, stop):
                trained[pos] = True

        prefix = [0]  # prefix sums: does a token's character span touch a trained character?
        for flag in trained:
            prefix.append(prefix[-1] + flag)
        loss_mask = [1 if e > s and prefix[e] - prefix[s] > 0 else 0 for s, e in offsets]
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_distill_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        prompt = self.tokenizer.apply_chat_template(
            messages[:1], tokenize=False, add_generation_prompt=True, tools=tools
        )
        prompt_ids = self._encode(prompt)
        response_ids = self._encode(messages[-1]["content"])
        token_ids = prompt_ids + response_ids
        if not _trained(messages[-1]):
            return token_ids, [0] * len(token_ids)
        return token_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    # ---- entry points ---------------------------------------------------------------------------

    def get_loss_mask(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        kind = self.tokenizer_type
        if kind == "qwen":
            if _DISTILL_ASSISTANT_TOKEN in self.tokenizer.get_added_vocab():
                return self.gen_multi_turn_loss_mask_distill_qwen(messages, tools)
            return self.gen_multi_turn_loss_mask_qwen(messages, tools)
        if kind == "qwen3":
            return self.gen_multi_turn_loss_mask_qwen3(messages, tools)
        if kind == "qwen3_5":
            return self.gen_multi_turn_loss_mask_qwen3_5(messages, tools)
        if kind == "distill_qwen":
            return self.gen_multi_turn_loss_mask_distill_qwen(messages, tools)
        raise ValueError(f"Unsupported tokenizer type: {kind} (supported: {', '.join(TOKENIZER_TYPES)})")

    def get_loss_mask_with_multimodal_alignment(
        self, messages: list[dict], input_ids: list[int], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """The mask of the text-only conversation, left-padded with 0s to the processor's
        `input_ids` (whose image/video placeholders expand into more tokens, all before the
        trained part in a prompt-then-answer conversation)."""
        text_only = []
        for msg in messages:
            content = msg.get("content")
            if isinstance(content, list):
                parts = [
                    item.get("text", "") if isinstance(item, dict) else item
                    for item in content
                    if isinstance(item, str) or (isinstance(item, dict) and item.get("type") == "text")
                ]
                msg = {"role": msg["role"], "content": " ".join(parts)}
            text_only.append(msg)
        _, text_mask = self.get_loss_mask(text_only, tools=tools)
        extra = len(input_ids) - len(text_mask)
        if extra < 0:
            raise AssertionError(
                f"input_ids (length={len(input_ids)}) is shorter than text loss_mask "
                f"(length={len(text_mask)}); check that processor and tokenizer tokenize alike."
            )
        return input_ids, [0] * extra + text_mask

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        """The decoded text of each maximal run of trained tokens, in order. As slime's, ids past
        the end of the mask are not read; a mask longer than the ids is an error."""
        if len(loss_masks) > len(token_ids):
            raise ValueError(f"loss mask has {len(loss_masks)} entries for {len(token_ids)} token ids")
        texts: list[str] = []
        run: list[int] = []
        for token, mask in zip(token_ids, loss_masks, strict=False):
            if mask == 1:
                run.append(token)
            elif run:
                texts.append(self.tokenizer.decode(run))
                run = []
        if run:
            texts.append(self.tokenizer.decode(run))
        return texts
