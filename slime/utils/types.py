"""`Sample`: the unit of data that flows from rollout to training.

Fields, defaults and methods are slime's `slime.utils.types.Sample`, so a slime user's hooks run
unchanged. torch is imported only by the methods that handle tensors (top-p replay, routed
experts), so the engine-free ground stays light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from slime.utils.misc import decode_int32_meta_array

_TOP_P_TOKEN_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _int_list(values: Any) -> list[int]:
    if values is None:
        return []
    if hasattr(values, "tolist"):  # a tensor or an array
        values = values.reshape(-1).tolist()
    return [int(v) for v in values]


def _float_list(values: Any) -> list[float] | None:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.reshape(-1).tolist()
    return [float(v) for v in values]


def _flat_int32(values: Any, default: list[int]) -> Any:
    import torch

    return torch.as_tensor(default if values is None else values, dtype=torch.int32).reshape(-1)


def _jsonable(value: Any) -> Any:
    """Tensors as nested lists, so `to_dict` output can be written as JSON (the Data Buffer's state)."""
    return value.tolist() if hasattr(value, "tolist") and hasattr(value, "dtype") else value


@dataclass
class Sample:
    """One prompt and (after rollout) one response, with everything training needs."""

    group_index: int | None = None
    index: int | None = None
    # rollout_id: the rollout execution this sample came from; None means `index`. Samples split
    # out of one execution (compaction, sub-agents) share it so the loss averages per execution.
    rollout_id: int | None = None
    # prompt: a string, or a list of chat messages before the chat template is applied
    prompt: str | list[dict[str, str]] = ""
    # tokens: prompt tokens followed by response tokens (exactly what the engine saw/produced)
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None  # raw images / videos / audio of the prompt
    multimodal_train_inputs: dict[str, Any] | None = None  # the processor's tensors (pixel_values, ...)
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    # label: the prompt row's label column as the file holds it (any JSON value, as slime keeps it)
    label: Any = None
    reward: float | dict[str, Any] | None = None
    # loss_mask: one entry per response token; 1 = trained on, 0 = not (e.g. tool output)
    loss_mask: list[int] | None = None
    # weight_versions: the engine's weight version for each generate call that produced tokens of
    # this sample (several when a partial rollout resumed it after a weight update)
    weight_versions: list[str] = field(default_factory=list)
    # rollout_log_probs: the engine's log-prob of each response token when it was sampled
    rollout_log_probs: list[float] | None = None
    # top-p replay: response token i kept ids[offsets[i]:offsets[i + 1]] in its nucleus
    rollout_top_p_token_ids: Any = None  # list[int] | torch.Tensor | None
    rollout_top_p_token_offsets: Any = None  # list[int] | torch.Tensor | None
    rollout_routed_experts: Any = None  # [token, layer, topk] experts chosen by the engine (MoE replay)
    # remove_sample: set by a --rollout-sample-filter-path hook; the sample stays in its group (the
    # group keeps its shape and it is counted) but its loss mask is zeroed: it is never trained on
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None  # the OPD teacher's log-prob of each response token

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        # a recoverable failure (tool error, reward error, ...): kept, counted, never trained on
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    # per-sample hooks (an eval data set's own generate function / reward) over the global ones
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    # train_metadata: extra per-sample data a custom loss may need
    train_metadata: dict | None = None
    # session_id: one multi-turn trajectory; its requests carry it in the router's routing-key
    # header (`X-SMG-Routing-Key`), so `--router-policy consistent_hashing` keeps it on one engine
    session_id: str | None = None
    non_generation_time: float = 0.0  # seconds spent outside generation (tools, environment)

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters summed over the sample's generate calls."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {
                "spec_accept_token_num": self.spec_accept_token_num,
                "spec_draft_token_num": self.spec_draft_token_num,
                "spec_verify_ct": self.spec_verify_ct,
                "completion_token_num": self.completion_token_num,
            }

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            keys = ("spec_accept_token_num", "spec_draft_token_num", "spec_verify_ct", "completion_token_num")
            return Sample.SpecInfo(**{k: data.get(k, 0) for k in keys})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        """Prompt tokens the engine found in its prefix cache, over all of the sample's calls."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {"cached_tokens": self.cached_tokens, "total_prompt_tokens": self.total_prompt_tokens}

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(
                cached_tokens=data.get("cached_tokens", 0), total_prompt_tokens=data.get("total_prompt_tokens", 0)
            )

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    # ---- serialisation (the Data Buffer's saved state) ----------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = {k: _jsonable(v) for k, v in self.__dict__.items()}
        d["status"] = self.status.value
        d["spec_info"] = self.spec_info.to_dict()
        d["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return d

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        """Inverse of `to_dict`. State saved before a field existed loads with its default; keys
        that are not fields become attributes of the sample, as slime does."""
        data = dict(data)
        status = data.get("status", Sample.Status.PENDING.value)
        data["status"] = status if isinstance(status, Sample.Status) else Sample.Status(status)
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info") or {})
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info") or {})
        names = Sample.__dataclass_fields__.keys()
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(sample, k, v)
        return sample

    # ---- reading -------------------------------------------------------------------------------

    def get_reward_value(self, args: Any) -> float:
        """The scalar reward; a dict reward is read at `args.reward_key` (slime's convention)."""
        if isinstance(self.reward, dict):
            key = args.reward_key or "score"  # dapo-style {score, acc, pred} without --reward-key
            return float(self.reward[key])
        return float(self.reward if self.reward is not None else 0.0)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Response tokens trained on (the loss mask's sum; the whole response without a mask)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    # ---- building a response -------------------------------------------------------------------

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Extend the response and keep loss mask, log-probs and replay data aligned with it.

        Model tokens: `trainable=True` with the engine's `log_probs` (and its `meta_info`, which
        also sets the status from `finish_reason`). Tool / environment tokens: `trainable=False`
        and no log-probs; they get loss mask 0, log-prob 0.0 and empty top-p spans.
        """
        tokens = _int_list(tokens)
        log_probs = _float_list(log_probs)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)

        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:  # everything so far was trained on
                self.loss_mask = [1] * before
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:  # we cannot invent the log-probs of earlier model tokens
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing "
                        "response tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += log_probs

        pad_top_p = bool(tokens and not trainable)
        if meta_info is not None or pad_top_p:
            self._apply_meta_info(
                args,
                meta_info or {},
                new_token_count=len(tokens),
                pad_missing_top_p=pad_top_p,
                update_terminal_info=update_terminal_info,
            )
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: dict,
        *,
        new_token_count: int = 0,
        pad_missing_top_p: bool = False,
        update_terminal_info: bool = True,
    ) -> None:
        import torch

        got_top_p = False
        if new_token_count:
            ids = decode_int32_meta_array(meta_info, _TOP_P_TOKEN_ID_KEYS)
            offsets = decode_int32_meta_array(meta_info, _TOP_P_OFFSET_KEYS)
            if ids is not None or offsets is not None:
                _check_top_p(ids, offsets, new_token_count)
                got_top_p = True
                if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
                    self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
                else:  # continue the ragged layout: shift the new offsets past the old ids
                    base_ids = _flat_int32(self.rollout_top_p_token_ids, [])
                    base_offsets = _flat_int32(self.rollout_top_p_token_offsets, [0])
                    self.rollout_top_p_token_ids = torch.cat([base_ids, ids])
                    self.rollout_top_p_token_offsets = torch.cat([base_offsets, offsets[1:] + int(base_offsets[-1])])
        if pad_missing_top_p and new_token_count and self.rollout_top_p_token_offsets is not None and not got_top_p:
            if self.rollout_top_p_token_ids is None:
                raise ValueError("Cannot append empty top-p spans without existing token ids and offsets.")
            offsets = _flat_int32(self.rollout_top_p_token_offsets, [])
            if offsets.numel() == 0:
                raise ValueError("Cannot append empty top-p spans to empty offsets.")
            self.rollout_top_p_token_ids = _flat_int32(self.rollout_top_p_token_ids, [])
            self.rollout_top_p_token_offsets = torch.cat(
                [offsets, offsets.new_full((new_token_count,), int(offsets[-1]))]
            )

        experts = decode_int32_meta_array(meta_info, "routed_experts")
        if experts is not None:
            self._apply_routed_experts(args, meta_info, experts)

        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info=meta_info)  # summed here: a partial rollout spans several calls
        self.prefix_cache_info.add(meta_info=meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = meta_info["finish_reason"]["type"]
        if finish == "length":
            self.status = Sample.Status.TRUNCATED
        elif finish == "abort":
            self.status = Sample.Status.ABORTED
        elif finish == "stop":
            self.status = Sample.Status.COMPLETED

    def _apply_routed_experts(self, args: Any, meta_info: dict, experts: Any) -> None:
        """The engine reports experts for positions `start..len(tokens)-2` (each token's input)."""
        import torch

        if args is None:
            raise ValueError("args is required to decode routed experts metadata.")
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        if start < 0:
            raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start}.")
        rows = max(0, len(self.tokens) - 1 - start)
        expected = rows * args.num_layers * args.moe_router_topk
        if experts.numel() != expected:
            raise ValueError(
                f"SGLang routed_experts element count does not match sample tokens: "
                f"got={experts.numel()}, expected={expected} (tokens={len(self.tokens)}, "
                f"routed_experts_start_len={start}, num_layers={args.num_layers}, "
                f"moe_router_topk={args.moe_router_topk})."
            )
        experts = experts.reshape(rows, args.num_layers, args.moe_router_topk)
        if start == 0:
            self.rollout_routed_experts = experts
            return
        existing = self.rollout_routed_experts
        if existing is None:
            raise ValueError(
                f"Cannot append partial routed experts without existing routed experts "
                f"(routed_experts_start_len={start})."
            )
        existing = torch.as_tensor(existing, dtype=experts.dtype)
        if existing.shape[0] < start:
            raise ValueError(
                f"Existing routed experts shorter than routed_experts_start_len: "
                f"existing_rows={existing.shape[0]}, routed_experts_start_len={start}."
            )
        self.rollout_routed_experts = torch.cat([existing[:start], experts], dim=0)

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
            return
        if self.rollout_top_p_token_ids is None or self.rollout_top_p_token_offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        offsets = _flat_int32(self.rollout_top_p_token_offsets, [])
        if offsets.numel() != self.response_length + 1:
            raise ValueError(
                f"rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={offsets.numel()}, response_length={self.response_length}."
            )
        n_ids = _flat_int32(self.rollout_top_p_token_ids, []).numel()
        if int(offsets[-1]) != n_ids:
            raise ValueError(
                f"rollout top-p token ids/offsets mismatch: offsets[-1]={int(offsets[-1])}, len(token_ids)={n_ids}."
            )


def _check_top_p(ids: Any, offsets: Any, new_tokens: int) -> None:
    """The engine's ragged top-p replay of `new_tokens` tokens: ids plus `new_tokens + 1` offsets from 0."""
    if ids is None or offsets is None:
        raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
    if offsets.numel() == 0 or int(offsets[0]) != 0:
        raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1].tolist()}.")
    if int(offsets[-1]) != ids.numel():
        raise ValueError(
            f"SGLang top-p token ids/offsets mismatch: offsets[-1]={int(offsets[-1])}, len(token_ids)={ids.numel()}."
        )
    if offsets.numel() != new_tokens + 1:
        raise ValueError(
            f"SGLang top-p token offsets length must equal generated token count + 1: "
            f"len(offsets)={offsets.numel()}, generated={new_tokens}."
        )


@dataclass(frozen=True)
class ParamInfo:
    """One parameter's description in a weight transfer (slime's name)."""

    name: str
    dtype: Any  # torch.dtype
    shape: Any  # torch.Size
    attrs: dict
    size: int
    src_rank: int


# The column batch handed from rollout to training: name -> one entry per sample.
RolloutBatch = dict[str, list[Any]]


@dataclass
class MultimodalType:
    name: str  # the content type in chat messages ("image")
    placeholder: str  # its placeholder in the prompt text ("<image>")


class MultimodalTypes:
    IMAGE = MultimodalType(name="image", placeholder="<image>")
    VIDEO = MultimodalType(name="video", placeholder="<video>")
    AUDIO = MultimodalType(name="audio", placeholder="<audio>")

    @classmethod
    def all(cls) -> list[MultimodalType]:
        return [cls.IMAGE, cls.VIDEO, cls.AUDIO]

    @classmethod
    def get(cls, name: str) -> MultimodalType | None:
        return next((m for m in cls.all() if m.name == name), None)
