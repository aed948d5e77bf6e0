"""Checks that run before any process is launched, so bad input fails in seconds, not minutes.

Each failure raises `SlimeError` naming the argument, file or line to fix.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
from argparse import Namespace
from pathlib import Path

from slime.errors import SlimeError
from slime.utils.misc import load_function


def check_hf_checkpoint(path: str | None, arg: str) -> None:
    if not path:
        raise SlimeError(f"{arg} is required (a local Hugging Face model directory)")
    p = Path(path)
    if not p.is_dir():
        raise SlimeError(f"{arg} {path}: not a directory")
    config = p / "config.json"
    if not config.is_file():
        raise SlimeError(f"{arg} {path}: no config.json (not a Hugging Face model directory)")
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise SlimeError(f"{arg} {path}: cannot read config.json: {e}") from e
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise SlimeError(f"{arg} {path}: no weight files (*.safetensors or *.bin)")


def check_context_length(args: Namespace) -> None:
    """Prompt + response must fit the model's context: say so now, not as 400s mid-rollout."""
    config = json.loads((Path(args.hf_checkpoint) / "config.json").read_text())
    context = config.get("max_position_embeddings")
    if not context:
        return
    for arg, value in (("--rollout-max-response-len", args.rollout_max_response_len),
                       ("--eval-max-response-len", args.eval_max_response_len)):
        if value >= context:
            raise SlimeError(
                f"{arg} {value} does not fit the model's context length {context} "
                f"(max_position_embeddings in {args.hf_checkpoint}/config.json); use a smaller value"
            )


def check_passthrough_args(parser: argparse.ArgumentParser, sglang_args: list[str], engine: str) -> None:
    """Validate `--sglang-*` pass-through against the parser of the engine that will run it."""
    known = sorted({s for a in parser._actions for s in a.option_strings})
    for tok in sglang_args:
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0]
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean --sglang-{close[0][2:]}?" if close else ""
            raise SlimeError(f"unknown engine argument --sglang-{name[2:]} ({engine} has no {name}){hint}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(["--model-path", "x", *sglang_args])
    except SystemExit as e:
        msg = err.getvalue().strip().splitlines()
        raise SlimeError(f"invalid --sglang-* arguments for {engine}: {msg[-1] if msg else ' '.join(sglang_args)}") from e


def check_engine_args(sglang_args: list[str]) -> None:
    """Validate `--sglang-*` pass-through against the built-in engine's own parser."""
    from slime.engine.server import build_arg_parser

    check_passthrough_args(build_arg_parser(), sglang_args, "the built-in engine")


# Each hook argument, with how slime calls it (positional names, keyword arguments passed) and
# whether slime awaits it. A hook must accept that call; both sync and async functions work
# everywhere here (an awaitable result is awaited), a superset of slime's rules.
HOOK_CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "eval_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "custom_generate_function_path": (("args", "sample", "sampling_params"), ()),
    "custom_rm_path": (("args", "sample_or_samples"), ()),
    "dynamic_sampling_filter_path": (("args", "samples"), ()),
    "custom_reward_post_process_path": (("args", "samples"), ()),
    "custom_convert_samples_to_train_data_path": (("args", "samples", "raw_rewards", "rewards"), ()),
    "rollout_data_postprocess_path": (("args", "rollout_id", "rollout_data"), ()),
    "buffer_filter_path": (("args", "rollout_id", "buffer", "num_samples"), ()),
    "rollout_sample_filter_path": (("args", "samples"), ()),
    "data_source_path": (("args",), ()),
}


def check_hook(arg: str, path: str) -> None:
    """Import the hook and check it accepts the call slime makes; else one line naming arg and path."""
    import inspect

    flag = "--" + arg.replace("_", "-")
    fn = load_function(path, arg_name=flag)
    if not callable(fn):
        raise SlimeError(f"{flag} {path}: not callable (it is a {type(fn).__name__})")
    positional, keywords = HOOK_CALLS[arg]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: nothing to check
    try:
        sig.bind(*positional, **{k: None for k in keywords})
    except TypeError as e:
        call = ", ".join([*positional, *(f"{k}=..." for k in keywords)])
        raise SlimeError(f"{flag} {path}: signature {fn.__name__}{sig} cannot be called as "
                         f"{fn.__name__}({call}) ({e})") from None


def check_hooks(args: Namespace) -> None:
    for arg in HOOK_CALLS:
        path = getattr(args, arg, None)
        if path:
            check_hook(arg, path)


def check_reward_args(args: Namespace) -> None:
    ratio = getattr(args, "max_failed_sample_ratio", 0.5)
    if ratio is not None and not 0.0 <= ratio <= 1.0:
        raise SlimeError(f"--max-failed-sample-ratio must be in [0, 1], got {ratio}")
    over = getattr(args, "over_sampling_batch_size", None)
    if over is not None and over < 1:
        raise SlimeError(f"--over-sampling-batch-size must be >= 1, got {over}")
    if over is not None and not (getattr(args, "dynamic_sampling_filter_path", None)
                                 or getattr(args, "partial_rollout", False)):
        raise SlimeError("--over-sampling-batch-size only applies with --dynamic-sampling-filter-path "
                         "or --partial-rollout")
    if getattr(args, "mask_offpolicy_in_partial_rollout", False) and not getattr(args, "partial_rollout", False):
        raise SlimeError("--mask-offpolicy-in-partial-rollout needs --partial-rollout")
    for name in ("rm_timeout", "rm_max_retries", "sandbox_timeout", "sandbox_cpu_time", "sandbox_memory_mb",
                 "sandbox_concurrency"):
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            raise SlimeError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    rm_type = (getattr(args, "rm_type", None) or "").removeprefix("boxed_")
    if rm_type == "remote_rm" and not getattr(args, "custom_rm_path", None):
        url = getattr(args, "rm_url", None)
        if not url or not url.startswith(("http://", "https://")):
            raise SlimeError(f"--rm-type remote_rm needs --rm-url http://HOST:PORT/PATH (got {url!r})")


def preflight(args: Namespace) -> None:
    from slime.data.dataset import load_prompt_samples
    from slime.rollout.rm_hub import validate_rm_type

    check_hf_checkpoint(args.hf_checkpoint, "--hf-checkpoint")
    check_context_length(args)
    if args.use_kl_loss:
        check_hf_checkpoint(args.ref_load, "--ref-load")
    if args.load:
        from slime.backends.torch.checkpoint import latest_dir

        latest_dir(args.load)

    check_hooks(args)
    check_reward_args(args)

    if args.loss_type == "policy_loss" and not args.custom_rm_path:
        if args.rm_type is None:
            raise SlimeError("--rm-type (or --custom-rm-path) is required for RL training")
        validate_rm_type(args.rm_type)
    elif args.rm_type is not None:
        validate_rm_type(args.rm_type)

    from slime.arguments import DEFAULT_DATA_SOURCE

    if not args.prompt_data and args.data_source_path == DEFAULT_DATA_SOURCE:
        raise SlimeError("--prompt-data is required (or a --data-source-path that provides prompts)")
    if args.prompt_data:
        # Reading every row now catches a malformed line, a missing key, a chat template that fails
        # or a length limit that leaves nothing, before anything starts.
        tokenizer = None
        if args.apply_chat_template or args.rollout_max_prompt_len:
            from slime.data.data_source import load_tokenizer

            tokenizer = load_tokenizer(args.hf_checkpoint)
        prompts = load_prompt_samples(
            args.prompt_data, input_key=args.input_key, label_key=args.label_key, metadata_key=args.metadata_key,
            tool_key=args.tool_key, tokenizer=tokenizer, apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs, max_prompt_len=args.rollout_max_prompt_len)
        if not prompts:
            raise SlimeError(f"--prompt-data {args.prompt_data!r} holds no prompts ({prompts.num_dropped} longer "
                             f"than --rollout-max-prompt-len {args.rollout_max_prompt_len})")
    if args.eval_prompt_data:
        for name, path in zip(args.eval_prompt_data[0::2], args.eval_prompt_data[1::2]):
            load_prompt_samples(path, input_key=args.eval_input_key, label_key=args.eval_label_key)

    if args.sglang_router_ip is None:
        if getattr(args, "rollout_backend", "builtin") == "sglang":
            from slime.engine.sglang_backend import validate_sglang_args

            validate_sglang_args(args.sglang_args)  # against sglang.launch_server's own parser
        else:
            check_engine_args(args.sglang_args)
