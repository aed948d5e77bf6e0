"""OpenAI request bodies -> engine requests.

`parse_completion(body, ctx)` and `parse_chat(body, ctx)` validate a `/v1/completions` or
`/v1/chat/completions` body and build its `Plan`: the `Req`s to run (prompt-major: choice
`i * n + j` is prompt i's j-th sample) and how to answer. Field names, defaults and meanings are
SGLang's (which are OpenAI's plus SGLang's extras: `top_k`, `min_p`, `min_tokens`,
`stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `no_stop_trim`, `chat_template_kwargs`,
...). A field the engine does not implement is accepted only at its neutral value, an unknown
field is refused (as OpenAI does), and every refusal is an `APIError` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slime.engine.chat import MessageError, chat_messages, function_tools, render_chat
from slime.engine.http import openai_error_body
from slime.engine.request import Req, check_token_ids, encode_text, make_request
from slime.engine.sampling import BadRequest, SamplingParams

# OpenAI's cap on `logprobs` / `top_logprobs` alternatives per token
MAX_TOP_LOGPROBS = 20

# sampling fields with the same name and meaning in the request and in SamplingParams
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens")
_SAMPLING_EXTRA = ("no_stop_trim",)
# accepted only at their neutral value: the engine does not implement them
_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": {},
    "regex": None,
    "ebnf": None,
    "json_schema": None,
    "stop_regex": None,
    "lora_path": None,
    "session_params": None,
    "custom_logit_processor": None,
    "return_hidden_states": False,
    "return_routed_experts": False,
    "response_format": {"type": "text"},
}
# accepted and ignored: routing, accounting and metadata with no effect on the output here
_IGNORED = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "priority",
    "extra_key",
    "cache_salt",
    "custom_params",
    "custom_labels",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "return_cached_tokens_details",
    "session_id",
}
_COMMON = {
    "model",
    "n",
    "max_tokens",
    "seed",
    "stream",
    "stream_options",
    "min_tokens",
    "rid",
    "return_token_ids",
    "logprobs",
    *_SAMPLING,
    *_SAMPLING_EXTRA,
}
# chat's true / false fields (those in _TRUE_FLAGS default to true)
_CHAT_FLAGS = (
    "return_token_ids",
    "return_prompt_token_ids",
    "separate_reasoning",
    "parallel_tool_calls",
    "stream_reasoning",
)
_TRUE_FLAGS = {"separate_reasoning", "parallel_tool_calls", "stream_reasoning"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {
    "messages",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "continue_final_message",
    "separate_reasoning",
    "stream_reasoning",
    "reasoning_effort",
    "return_prompt_token_ids",
}


class APIError(Exception):
    """An error answered in SGLang's OpenAI shape (`body()`), HTTP `status`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status

    def body(self) -> dict:
        return openai_error_body(str(self), self.status, self.param)


@dataclass
class Context:
    """What validating a request needs from the server."""

    runner: Any  # slime.engine.model_runner.ModelRunner (its tokenizer, context length, vocab)
    max_total_tokens: int | None
    max_batch: int  # --max-batch-request-size: prompts x n at most
    model_name: str
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    chat_defaults: dict = field(default_factory=dict)  # the model's generation_config sampling values


@dataclass
class Plan:
    """One /v1 request, validated: the engine requests to run and how to answer."""

    kind: str  # "completion" | "chat"
    model: str
    reqs: list[Req]  # prompt-major: choice i * n + j is prompt i's j-th sample
    n: int
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: no log-probs; else the top-k alternatives per token (0: none)
    echo: bool = False
    prompt_texts: list[str | None] = field(default_factory=list)  # completions: a text prompt's text
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False
    tools: list[dict] | None = None  # chat: the tools offered to the template
    tool_parser: str | None = None  # chat: parse tool calls (only with tools)
    reasoning_parser: str | None = None  # chat: split reasoning off

    @property
    def parses_output(self) -> bool:
        """Whether a chat answer is parsed (tool calls, reasoning) rather than plain content."""
        return bool(self.tools and self.tool_parser) or self.reasoning_parser is not None

    @property
    def num_prompts(self) -> int:
        return len(self.reqs) // self.n


# ------------------------------------------------------------------------------------ the two bodies
def parse_completion(body: Any, ctx: Context) -> Plan:
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    n = _n(body)
    if body.get("best_of") not in (None, n):
        raise APIError(f"best_of={body['best_of']!r} is not supported by the built-in engine (only n)", "best_of")
    if body.get("suffix"):
        raise APIError("suffix is not supported by the built-in engine", "suffix")
    echo = _bool(body, "echo", False)
    # max_tokens 0 only with echo: the prompt's log-probs, nothing generated (OpenAI's legacy use)
    max_tokens = _int(body, "max_tokens", 16, lo=0 if echo else 1)
    logprobs = _opt_int(body, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    stream, include_usage = _stream(body)
    return_token_ids = _bool(body, "return_token_ids", False)
    sp = _sampling(body, ctx, max_tokens, {})
    prompts, texts = _completion_prompts(body.get("prompt"), ctx, n)
    reqs = _requests(
        prompts,
        sp,
        n,
        ctx,
        body,
        prompt_name="prompt",
        return_logprob=logprobs is not None,
        logprob_start_len=0 if echo and logprobs is not None else -1,
        top_logprobs_num=logprobs or 0,
    )
    return Plan(
        kind="completion",
        model=_model(body, ctx),
        reqs=reqs,
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        echo=echo,
        prompt_texts=texts,
        return_token_ids=return_token_ids,
    )


def parse_chat(body: Any, ctx: Context) -> Plan:
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    n = _n(body)
    max_tokens = _opt_int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", lo=1)  # None: up to the context length
    logprobs = _bool(body, "logprobs", False)
    top = _opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
    stream, include_usage = _stream(body)
    flags = {k: _bool(body, k, k in _TRUE_FLAGS) for k in _CHAT_FLAGS}  # checked before the template runs
    _check_batch(n, ctx)
    tools = _tools(body)
    ids = _chat_prompt(body, tools, ctx)
    parse_tools = bool(tools and ctx.tool_parser)
    defaults = dict(ctx.chat_defaults)
    if parse_tools:  # a tool-call marker may be a special token: keep them in the text to parse (SGLang's way)
        defaults["skip_special_tokens"] = False
    sp = _sampling(body, ctx, max_tokens, defaults)
    reqs = _requests(
        [ids],
        sp,
        n,
        ctx,
        body,
        prompt_name="messages",
        return_logprob=logprobs,
        top_logprobs_num=(top or 0) if logprobs else 0,
    )
    return Plan(
        kind="chat",
        model=_model(body, ctx),
        reqs=reqs,
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=(top or 0) if logprobs else None,
        return_token_ids=flags["return_token_ids"],
        return_prompt_token_ids=flags["return_prompt_token_ids"],
        tools=tools,
        tool_parser=ctx.tool_parser if parse_tools else None,
        reasoning_parser=ctx.reasoning_parser if flags["separate_reasoning"] else None,
    )


# ------------------------------------------------------------------------------------ fields
def _check_fields(body: Any, known: set[str], route: str) -> None:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    for key, value in body.items():
        if key in known or key in _IGNORED:
            continue
        if key in _NEUTRAL:
            neutral = _NEUTRAL[key]
            if value is not None and value != neutral and not (isinstance(neutral, dict) and value == {}):
                raise APIError(f"{key}={value!r} is not supported by the built-in engine", key)
            continue
        raise APIError(f"unknown field {key!r} in a {route} request", key)


def _int(body: dict, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
    v = _opt_int(body, name, lo, hi)
    return default if v is None else v


def _opt_int(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """The integer field `name` (None when absent or null), checked against [lo, hi]."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError(f"{name} must be an integer, got {v!r}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rule = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise APIError(f"{name} must be {rule}, got {v}", name)
    return v


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(f"{name} must be true or false, got {v!r}", name)
    return v


def _model(body: dict, ctx: Context) -> str:
    """The answer's `model`: the request's (SGLang serves any name), else the served name."""
    model = body.get("model")
    if model is None:
        return ctx.model_name
    if not isinstance(model, str):
        raise APIError(f"model must be a string, got {model!r}", "model")
    return model


def _n(body: dict) -> int:
    return _int(body, "n", 1, lo=1)


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise APIError("stream_options must be an object", "stream_options")
    unknown = set(opts) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        raise APIError(f"unknown field {sorted(unknown)[0]!r} in stream_options", "stream_options")
    if _bool(opts, "continuous_usage_stats", False):
        raise APIError(
            "stream_options.continuous_usage_stats is not supported by the built-in engine", "stream_options"
        )
    return stream, _bool(opts, "include_usage", False)


def _sampling(body: dict, ctx: Context, max_tokens: int | None, defaults: dict) -> SamplingParams:
    """The request's SamplingParams (SGLang's names; `defaults` where the request has no value)."""
    d = {k: body[k] for k in (*_SAMPLING, *_SAMPLING_EXTRA) if body.get(k) is not None}
    for k, v in defaults.items():
        d.setdefault(k, v)
    min_tokens = _int(body, "min_tokens", 0, lo=0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise APIError(f"min_tokens ({min_tokens}) must not be more than max_tokens ({max_tokens})", "min_tokens")
    d.update(max_new_tokens=max_tokens, min_new_tokens=min_tokens, sampling_seed=_opt_int(body, "seed"))
    try:
        return SamplingParams.from_dict(d, vocab_size=ctx.runner.vocab_size, where="")
    except BadRequest as e:
        raise APIError(str(e), e.param) from None


def _check_batch(count: int, ctx: Context) -> None:
    if count > ctx.max_batch:
        raise APIError(
            f"this request asks for {count} completions (prompts x n), more than --max-batch-request-size "
            f"{ctx.max_batch}; split it",
            "n",
        )


def _requests(
    prompts: list[list[int]], sp: SamplingParams, n: int, ctx: Context, body: dict, *, prompt_name: str, **fields
) -> list[Req]:
    """n requests per prompt; with a seed, sample j draws from seed + j (so the n samples differ,
    and sample 0 is what n=1 gives)."""
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise APIError(f"rid must be a string, got {rid!r}", "rid")
    count = len(prompts) * n
    reqs = []
    for i, ids in enumerate(prompts):
        where = f"[{i}]" if len(prompts) > 1 else ""
        for j in range(n):
            sp_j = sp
            if j and sp.sampling_seed is not None:
                sp_j = replace(sp, sampling_seed=(sp.sampling_seed + j) & 0xFFFF_FFFF_FFFF_FFFF)
            rid_j = rid if rid is None or count == 1 else f"{rid}-{i * n + j}"
            try:
                reqs.append(
                    make_request(
                        ids,
                        sp_j,
                        ctx.runner,
                        ctx.max_total_tokens,
                        where=where,
                        new_tokens_name="max_tokens",
                        rid=rid_j,
                        **fields,
                    )
                )
            except BadRequest as e:
                raise APIError(str(e), e.param or prompt_name) from None
    return reqs


# ------------------------------------------------------------------------------------ prompts
def _completion_prompts(prompt: Any, ctx: Context, n: int) -> tuple[list[list[int]], list[str | None]]:
    """(token ids, text or None for token ids) of each prompt: a string, a list of strings, token ids
    or a list of token-id lists."""
    if prompt is None:
        raise APIError("prompt is required", "prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise APIError("prompt must be a string, a list of strings, token ids or a list of token-id lists", "prompt")
    _check_batch(len(prompt) * n, ctx)
    try:
        if all(isinstance(p, str) for p in prompt):
            return [encode_text(p, _at("prompt", i, prompt), ctx.runner) for i, p in enumerate(prompt)], list(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = [prompt]
        if not all(isinstance(p, list) for p in prompt):
            raise APIError(
                "prompt must be a string, a list of strings, token ids or a list of token-id lists", "prompt"
            )
        for i, ids in enumerate(prompt):
            check_token_ids(ids, _at("prompt", i, prompt), ctx.runner.vocab_size)
    except BadRequest as e:
        raise APIError(str(e), "prompt") from None
    return [list(p) for p in prompt], [None] * len(prompt)


def _at(name: str, i: int, items: list) -> str:
    return f"{name}[{i}]" if len(items) > 1 else name


def _tools(body: dict) -> list[dict] | None:
    """The tools offered to the template: none with tool_choice "none". The engine does not
    constrain decoding, so "required" and a named function offer the tools and let the model choose."""
    choice = body.get("tool_choice")
    named = isinstance(choice, dict) and choice.get("type", "function") == "function"
    if choice is not None and choice not in ("none", "auto", "required") and not named:
        raise APIError(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    try:
        tools = function_tools(body.get("tools"))
    except MessageError as e:
        raise APIError(str(e), e.param) from None
    return None if choice == "none" else tools


def _chat_prompt(body: dict, tools: list[dict] | None, ctx: Context) -> list[int]:
    """The conversation rendered with the model's chat template, as token ids."""
    try:
        messages = chat_messages(body.get("messages"))
    except MessageError as e:
        raise APIError(str(e), e.param) from None
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise APIError("chat_template_kwargs must be an object", "chat_template_kwargs")
    kwargs = {**_reasoning_kwargs(body), **kwargs}
    cont = _bool(body, "continue_final_message", False)
    if cont and messages[-1]["role"] != "assistant":
        raise APIError("continue_final_message needs the last message to be the assistant's", "messages")
    try:
        text = render_chat(
            ctx.runner.tokenizer, messages, tools, kwargs, add_generation_prompt=not cont, continue_final_message=cont
        )
    except Exception as e:  # noqa: BLE001 - the template refused the conversation (a jinja error, a raise_exception)
        raise APIError(f"the chat template could not render the messages: {e}", "messages") from None
    try:  # the template wrote the special tokens it wants (a BOS included)
        return encode_text(text, "messages", ctx.runner, add_special_tokens=False)
    except BadRequest as e:
        raise APIError(str(e), "messages") from None


def _reasoning_kwargs(body: dict) -> dict:
    """reasoning_effort "none" turns thinking off in the template, any other value on (SGLang's
    mapping onto the `thinking` / `enable_thinking` switches templates read)."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return {}
    if not isinstance(effort, str):
        raise APIError(f"reasoning_effort must be a string, got {effort!r}", "reasoning_effort")
    on = effort != "none"
    return {"thinking": on, "enable_thinking": on}


# ------------------------------------------------------------------------------------ the model's defaults
def model_sampling_defaults(model_path: str) -> dict:
    """The sampling values a model's generation_config.json recommends (temperature, top_p, top_k,
    min_p): chat requests use them where they give none (SGLang's default). Others, and values
    this engine cannot use, are left out."""
    path = Path(model_path) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("temperature", "top_p", "top_k", "min_p"):
        v = config.get(key) if isinstance(config, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    try:
        SamplingParams.from_dict(out, vocab_size=1 << 30, where="generation_config")
    except BadRequest:
        return {}
    return out
