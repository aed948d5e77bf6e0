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

from slime.agent.generate import check_agent_args
from slime.arguments import DEFAULT_DATA_SOURCE, set_num_rollout
from slime.arguments.megatron import check_model_shape
from slime.checkpoint_sources import resolve_checkpoints
from slime.data.data_source import load_tokenizer
from slime.data.dataset import load_prompt_samples
from slime.engine.args import check_engine_args, check_model_dir
from slime.errors import SlimeError
from slime.observability.debug_data import load_rollout_data as load_debug_rollout_data
from slime.observability.run_dir import check_disk_room, check_run_dir
from slime.ray.engine_launch import validate_sglang_args
from slime.ray.router import check_router_args
from slime.ray.sglang_config import check_sglang_config
from slime.rollout.rm_hub import validate_rm_type
from slime.rollout.rm_hub.code import check_code_tests
from slime.rollout.sglang_rollout import load_eval_prompts
from slime.sandbox import check_sandbox
from slime.sync.external import discover as discover_external_engines
from slime.utils.checkpoint_layout import latest_dir
from slime.utils.eval_config import eval_dataset_configs
from slime.utils.misc import load_function

# Each hook argument, with how slime calls it (positional names, keyword arguments passed). A hook
# must accept that call; both sync and async functions work everywhere here (an awaitable result
# is awaited), a superset of slime's rules.
HOOK_CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "eval_function_path": (("args", "rollout_id", "data_source"), ("evaluation",)),
    "custom_generate_function_path": (("args", "sample", "sampling_params"), ()),
    "agent_function_path": (("base_url", "api_key", "sample"), ()),
    "custom_rm_path": (("args", "sample_or_samples"), ()),
    "dynamic_sampling_filter_path": (("args", "samples"), ()),
    "custom_reward_post_process_path": (("args", "samples"), ()),
    "custom_convert_samples_to_train_data_path": (("args", "samples"), ()),
    "rollout_data_postprocess_path": (("args", "rollout_id", "rollout_data"), ()),
    "buffer_filter_path": (("args", "rollout_id", "buffer", "num_samples"), ()),
    "rollout_sample_filter_path": (("args", "samples"), ()),
    "data_source_path": (("args",), ()),
    "custom_tis_function_path": (
        (),
        ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths", "response_lengths"),
    ),
    "custom_pg_loss_reducer_function_path": (
        ("total_lengths", "response_lengths", "loss_masks", "calculate_per_token_loss"),
        (),
    ),
    # a list (slime's action="append"); rollout_id / evaluation are passed only where the hook takes them
    "rollout_sample_hook_path": (("args", "sample"), ()),
    "custom_update_weight_post_write_path": (("args", "version_dir", "rollout_engines"), ()),
    "rollout_all_samples_process_path": (("args", "all_samples", "data_source"), ()),
    "custom_rollout_log_function_path": (
        ("rollout_id", "args", "samples", "rollout_extra_metrics", "rollout_time"),
        (),
    ),
    "custom_eval_rollout_log_function_path": (("rollout_id", "args", "data", "extra_metrics"), ()),
    # slime's Megatron plugin hooks, called by the fsdp trainer (slime.backends.torch.hooks)
    "custom_megatron_before_log_prob_hook_path": (("args", "model", "store_prefix"), ()),
    "custom_megatron_before_train_step_hook_path": (
        ("args", "rollout_id", "step_id", "model", "optimizer", "opt_param_scheduler"),
        (),
    ),
}


def check_context_length(args: Namespace, config: dict) -> None:
    """Prompt + response must fit the model's context: say so now, not as 400s mid-rollout."""
    context = config.get("max_position_embeddings")
    if not context:
        return
    limits = [
        ("--rollout-max-response-len", args.rollout_max_response_len),
        ("--eval-max-response-len", args.eval_max_response_len),
    ]
    limits += [
        (f"--eval-config {args.eval_config}: data set {c.name!r} max_response_len", c.max_response_len)
        for c in eval_dataset_configs(args)
        if args.eval_config
    ]
    for arg, value in limits:
        if value is not None and value >= context:
            raise SlimeError(
                f"{arg} {value} does not fit the model's context length {context} "
                f"(max_position_embeddings in {args.hf_checkpoint}/config.json); use a smaller value"
            )


def check_eval_sampling(args: Namespace) -> None:
    """What an --eval-config data set asks that the built-in engine cannot do, said before launch
    rather than as FAILED samples."""
    if args.rollout_backend != "builtin" or not args.eval_config:
        return
    for c in eval_dataset_configs(args):
        if c.repetition_penalty not in (None, 1.0):
            raise SlimeError(
                f"--eval-config {args.eval_config}: data set {c.name!r} sets repetition_penalty "
                f"{c.repetition_penalty}, which the built-in engine does not support (SGLang does)"
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
        sig.bind(*positional, **dict.fromkeys(keywords))
    except TypeError as e:
        call = ", ".join([*positional, *(f"{k}=..." for k in keywords)])
        raise SlimeError(
            f"{flag} {path}: signature {fn.__name__}{sig} cannot be called as {fn.__name__}({call}) ({e})"
        ) from None


def check_hooks(args: Namespace) -> None:
    for arg in HOOK_CALLS:
        value = getattr(args, arg)
        for path in [value] if isinstance(value, str) else value or ():  # an append option holds a list
            if path:
                check_hook(arg, path)


def check_reward(args: Namespace) -> None:
    if args.loss_type == "policy_loss" and not args.custom_rm_path and args.rm_type is None:
        raise SlimeError("--rm-type (or --custom-rm-path) is required for RL training")
    if args.rm_type is not None:
        validate_rm_type(args.rm_type)
    if (args.rm_type or "").removeprefix("boxed_") == "code":
        check_sandbox(args.sandbox_allow_unisolated)  # no isolation: stop now, naming what is missing


def reward_data_check(rm_type: str | None):
    """The reward's own check of a row's label, run as the data loads: the `code` reward's tests must
    exist and, when assert-style, split for its judge."""
    return check_code_tests if (rm_type or "").removeprefix("boxed_") == "code" else None


def check_data(args: Namespace) -> int | None:
    """Read every prompt row now: a malformed line, a missing key, a chat template that fails or a
    length limit that leaves nothing stops the run before anything starts. Returns the prompt count.
    With --disable-rollout-global-dataset --prompt-data is not loaded (slime's), so neither read here."""
    if not args.prompt_data and args.data_source_path == DEFAULT_DATA_SOURCE and args.rollout_global_dataset:
        raise SlimeError(
            "--prompt-data is required (or a --data-source-path that provides prompts, or "
            "--disable-rollout-global-dataset with a rollout function that brings its own)"
        )
    num_prompts = None
    if args.prompt_data and args.rollout_global_dataset:
        tokenizer = (
            load_tokenizer(args.hf_checkpoint) if (args.apply_chat_template or args.rollout_max_prompt_len) else None
        )
        prompts = load_prompt_samples(
            args.prompt_data,
            input_key=args.input_key,
            label_key=args.label_key,
            metadata_key=args.metadata_key,
            tool_key=args.tool_key,
            tokenizer=tokenizer,
            apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs,
            max_prompt_len=args.rollout_max_prompt_len,
            check=reward_data_check(args.rm_type),
        )
        if not prompts:
            raise SlimeError(
                f"--prompt-data {args.prompt_data!r} holds no prompts ({prompts.num_dropped} longer "
                f"than --rollout-max-prompt-len {args.rollout_max_prompt_len})"
            )
        num_prompts = len(prompts)
    check_eval_data(args)
    return num_prompts


def check_eval_data(args: Namespace) -> None:
    """Each eval data set read as eval will read it (its own keys and chat template, --eval-max-prompt-len),
    and its own reward and generate hook (--eval-config): a missing file or key stops the run now."""
    tokenizer = None
    for cfg in eval_dataset_configs(args):
        if tokenizer is None and (cfg.apply_chat_template or args.eval_max_prompt_len):
            tokenizer = load_tokenizer(args.hf_checkpoint)
        load_eval_prompts(args, cfg, tokenizer, reward_data_check(cfg.rm_type or args.rm_type))  # errors name the set
        try:
            if cfg.rm_type is not None:
                validate_rm_type(cfg.rm_type)
                if cfg.rm_type.removeprefix("boxed_") == "code":
                    check_sandbox(args.sandbox_allow_unisolated)
            for arg in ("custom_generate_function_path", "custom_rm_path"):
                if getattr(cfg, arg):
                    check_hook(arg, getattr(cfg, arg))
        except SlimeError as e:
            raise SlimeError(f"eval data set {cfg.name!r}: {e}") from None


def count_prompts(args: Namespace, num_prompts: int | None) -> int:
    """Prompts the data source hands out per epoch (a custom --data-source-path class counts its own)."""
    if args.data_source_path == DEFAULT_DATA_SOURCE and num_prompts is not None:
        return num_prompts
    return len(load_function(args.data_source_path, arg_name="--data-source-path")(args))


def preflight(args: Namespace) -> None:
    note = check_run_dir(args)  # before anything else: one run per run directory
    if note:
        print(f"[slime] {note}", flush=True)
    check_model_dir(args.hf_checkpoint, "--hf-checkpoint")
    if args.train_backend == "megatron":  # megatron-core as tested, no option it cannot serve yet
        from slime.backends.megatron_utils.actor import check_run

        check_run(args)
    check_disk_room(args)
    config_path = Path(args.hf_checkpoint) / "config.json"
    config = json.loads(config_path.read_text())
    check_model_shape(args, config, str(config_path))  # a slime script's Megatron model-config block
    check_context_length(args, config)
    check_eval_sampling(args)
    for note in resolve_checkpoints(args, config):
        print(f"[slime] {note}", flush=True)
    if args.use_kl_loss:
        check_model_dir(args.ref_load, "--ref-load")
    if args.load:
        latest_dir(args.load)
    check_hooks(args)
    if args.agent_function_path:  # the adapter's parsers (--sglang-tool-call-parser / -reasoning-parser)
        check_agent_args(args)
    if args.rollout_external_engine_addrs and not args.debug_train_only:  # every external engine answers
        discover_external_engines(
            args.rollout_external_engine_addrs, api_key=args.engine_api_key, admin_api_key=args.engine_admin_api_key
        )
    check_reward(args)
    num_prompts = check_data(args)
    if args.num_rollout is None:
        set_num_rollout(args, count_prompts(args, num_prompts))
    if args.load_debug_rollout_data:  # every replayed rollout is there, in this run's batch shape
        for rollout_id in range(args.start_rollout_id or 0, args.num_rollout):
            load_debug_rollout_data(args, rollout_id)
    if args.sglang_router_ip is None:
        note = check_router_args(args.router_args)
    else:
        note = (
            (
                f"--router-* options not used: the router at {args.sglang_router_ip}:{args.sglang_router_port} "
                f"is not started by this run"
            )
            if args.router_args
            else None
        )
    if note:
        print(f"[slime] {note}", flush=True)
    for note in check_sglang_config(args):  # every model's file, checkpoint and overrides, before launch
        print(f"[slime] {note}", flush=True)
    if args.sglang_router_ip is None:
        if args.rollout_backend == "sglang":
            validate_sglang_args(args.sglang_args)  # against sglang.launch_server's own parser
        else:
            check_engine_args(args.sglang_args)
