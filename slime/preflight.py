"""Checks on user input that need files or imports, run before any process is launched, so bad
input fails in seconds, not minutes. (Checks that need only the arguments run at parsing.)

Each failure raises `SlimeError` naming the argument, file or line to fix. `preflight` also
counts the prompts when `--num-epoch` sets `--num-rollout`: it reads the data anyway.
"""

from __future__ import annotations

import inspect
import json
from argparse import Namespace
from pathlib import Path

from slime.arguments import DEFAULT_DATA_SOURCE, set_num_rollout
from slime.arguments.megatron import check_model_shape
from slime.checkpoint_sources import resolve_checkpoints
from slime.data.data_source import load_tokenizer
from slime.data.dataset import load_prompt_samples
from slime.engine.args import check_engine_args, check_model_dir
from slime.errors import SlimeError
from slime.ray.engine_launch import validate_sglang_args
from slime.ray.router import check_router_args
from slime.rollout.rm_hub import validate_rm_type
from slime.utils.checkpoint_layout import latest_dir
from slime.utils.misc import load_function

# Each hook argument, with how slime calls it (positional names, keyword arguments passed). A hook
# must accept that call; both sync and async functions work everywhere here (an awaitable result
# is awaited), a superset of slime's rules.
HOOK_CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "eval_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "custom_generate_function_path": (("args", "sample", "sampling_params"), ()),
    "custom_rm_path": (("args", "sample_or_samples"), ()),
    "dynamic_sampling_filter_path": (("args", "samples"), ()),
    "custom_reward_post_process_path": (("args", "samples"), ()),
    "custom_convert_samples_to_train_data_path": (("args", "samples"), ()),
    "rollout_data_postprocess_path": (("args", "rollout_id", "rollout_data"), ()),
    "buffer_filter_path": (("args", "rollout_id", "buffer", "num_samples"), ()),
    "rollout_sample_filter_path": (("args", "samples"), ()),
    "data_source_path": (("args",), ()),
    "custom_tis_function_path": ((), ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks",
                                      "total_lengths", "response_lengths")),
    "custom_pg_loss_reducer_function_path": (("total_lengths", "response_lengths", "loss_masks",
                                              "calculate_per_token_loss"), ()),
}


def check_context_length(args: Namespace, config: dict) -> None:
    """Prompt + response must fit the model's context: say so now, not as 400s mid-rollout."""
    context = config.get("max_position_embeddings")
    if not context:
        return
    for arg, value in (("--rollout-max-response-len", args.rollout_max_response_len),
                       ("--eval-max-response-len", args.eval_max_response_len)):
        if value is not None and value >= context:
            raise SlimeError(
                f"{arg} {value} does not fit the model's context length {context} "
                f"(max_position_embeddings in {args.hf_checkpoint}/config.json); use a smaller value"
            )


def check_hook(arg: str, path: str) -> None:
    """Import the hook and check it accepts the call slime makes; else one line naming arg and path."""
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
        path = getattr(args, arg)
        if path:
            check_hook(arg, path)


def check_reward(args: Namespace) -> None:
    if args.loss_type == "policy_loss" and not args.custom_rm_path and args.rm_type is None:
        raise SlimeError("--rm-type (or --custom-rm-path) is required for RL training")
    if args.rm_type is not None:
        validate_rm_type(args.rm_type)


def check_data(args: Namespace) -> int | None:
    """Read every prompt row now: a malformed line, a missing key, a chat template that fails or a
    length limit that leaves nothing stops the run before anything starts. Returns the prompt count."""
    if not args.prompt_data and args.data_source_path == DEFAULT_DATA_SOURCE:
        raise SlimeError("--prompt-data is required (or a --data-source-path that provides prompts)")
    num_prompts = None
    if args.prompt_data:
        tokenizer = load_tokenizer(args.hf_checkpoint) if (args.apply_chat_template or args.rollout_max_prompt_len) else None
        prompts = load_prompt_samples(
            args.prompt_data, input_key=args.input_key, label_key=args.label_key, metadata_key=args.metadata_key,
            tool_key=args.tool_key, tokenizer=tokenizer, apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs, max_prompt_len=args.rollout_max_prompt_len)
        if not prompts:
            raise SlimeError(f"--prompt-data {args.prompt_data!r} holds no prompts ({prompts.num_dropped} longer "
                             f"than --rollout-max-prompt-len {args.rollout_max_prompt_len})")
        num_prompts = len(prompts)
    if args.eval_prompt_data:
        for path in args.eval_prompt_data[1::2]:
            load_prompt_samples(path, input_key=args.eval_input_key, label_key=args.eval_label_key)
    return num_prompts


def count_prompts(args: Namespace, num_prompts: int | None) -> int:
    """Prompts the data source hands out per epoch (a custom --data-source-path class counts its own)."""
    if args.data_source_path == DEFAULT_DATA_SOURCE and num_prompts is not None:
        return num_prompts
    return len(load_function(args.data_source_path, arg_name="--data-source-path")(args))


def preflight(args: Namespace) -> None:
    check_model_dir(args.hf_checkpoint, "--hf-checkpoint")
    config_path = Path(args.hf_checkpoint) / "config.json"
    config = json.loads(config_path.read_text())
    check_model_shape(args, config, str(config_path))  # a slime script's Megatron model-config block
    check_context_length(args, config)
    for note in resolve_checkpoints(args, config):
        print(f"[slime] {note}", flush=True)
    if args.use_kl_loss:
        check_model_dir(args.ref_load, "--ref-load")
    if args.load:
        latest_dir(args.load)
    check_hooks(args)
    check_reward(args)
    num_prompts = check_data(args)
    if args.num_rollout is None:
        set_num_rollout(args, count_prompts(args, num_prompts))
    if args.sglang_router_ip is None:
        if args.rollout_backend == "sglang":
            validate_sglang_args(args.sglang_args)  # against sglang.launch_server's own parser
        else:
            check_engine_args(args.sglang_args)
    if args.sglang_router_ip is None:
        note = check_router_args(args.router_args)
    else:
        note = (f"--router-* options not used: the router at {args.sglang_router_ip}:{args.sglang_router_port} "
                f"is not started by this run") if args.router_args else None
    if note:
        print(f"[slime] {note}", flush=True)
