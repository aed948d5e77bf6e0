"""The rollout: how many samples, how they are generated, rewarded and filtered, and the hooks
(dotted paths, slime's names and call signatures) that replace any step."""

from __future__ import annotations

import argparse
import math

from slime.arguments.checks import flag, require_positive
from slime.errors import SlimeError

DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout")
    g.add_argument(
        "--num-rollout",
        type=int,
        default=None,
        help="Rollouts to run, one training step each (or --num-epoch: counted from the data). 0: an "
        "eval-only run (slime's): the policy is evaluated once (with --eval-interval) and not trained.",
    )
    g.add_argument("--rollout-batch-size", type=int, default=None, help="Prompts per rollout.")
    g.add_argument(
        "--n-samples-per-prompt",
        type=int,
        default=1,
        help="Responses generated per prompt: the group GRPO normalises over.",
    )
    g.add_argument(
        "--rollout-max-response-len",
        type=int,
        default=None,
        help="max_new_tokens of each generate call (default, as slime's: none; the engine stops at "
        "the context length).",
    )
    g.add_argument(
        "--rollout-max-context-len",
        type=int,
        default=None,
        help="The engine's context during rollout: each default generate call asks for at most this "
        "minus the tokens it sends (prompt and response so far); --rollout-max-prompt-len "
        "defaults to this - 1, as slime's.",
    )
    g.add_argument(
        "--rollout-temperature", type=float, default=1.0, help="Sampling temperature of rollouts (> 0, slime's rule)."
    )
    g.add_argument(
        "--rollout-top-p",
        type=float,
        default=1.0,
        help="Nucleus sampling of rollouts: the smallest set of tokens holding this much probability, in (0, 1].",
    )
    g.add_argument(
        "--rollout-top-k", type=int, default=-1, help="Sample among the k most likely tokens (-1: all of them)."
    )
    g.add_argument(
        "--rollout-stop", type=str, nargs="+", default=None, help="Stop strings: a response ends at the first one."
    )
    g.add_argument(
        "--rollout-stop-token-ids",
        type=int,
        nargs="+",
        default=None,
        help="Token ids that end a response, besides the tokenizer's EOS.",
    )
    g.add_argument(
        "--rollout-skip-special-tokens",
        action="store_true",
        help="Decode responses without special tokens (SGLang's skip_special_tokens).",
    )
    _add_generation_arguments(g)
    _add_sample_hook_arguments(g)
    g.add_argument(
        "--max-turns",
        type=int,
        default=8,
        help="Multi-turn trajectories (slime.rollout.multi_turn): most model turns per sample.",
    )
    g.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="Multi-turn trajectories: most prompt + response tokens per sample.",
    )
    g.add_argument(
        "--max-failed-sample-ratio",
        type=float,
        default=0.5,
        help="Stop the run when more than this fraction of a rollout's samples FAILED "
        "(a hook or reward that raised); failed samples are never trained on.",
    )
    _add_reward_arguments(p)


def _add_generation_arguments(g: argparse._ArgumentGroup) -> None:
    """The rollout and generate functions, dynamic sampling, partial and fully async rollouts."""
    g.add_argument(
        "--rollout-function-path",
        type=str,
        default=DEFAULT_ROLLOUT_FUNCTION,
        help="The rollout function, generate_rollout(args, rollout_id, data_source, evaluation): one rollout's "
        "groups of samples.",
    )
    g.add_argument(
        "--custom-generate-function-path",
        type=str,
        default=None,
        help="Per-sample generation hook, async generate(args, sample, sampling_params) -> Sample (multi-turn, "
        "tools, agents). Default: one /generate call.",
    )
    g.add_argument(
        "--agent-function-path",
        type=str,
        default=None,
        help="With --custom-generate-function-path slime.agent.generate.generate: the agent, "
        "`async def run(base_url, api_key, sample) -> reward | None`, plain OpenAI-SDK code "
        "pointed at an adapter (base_url ends in /v1; api_key is the session id). Its turns "
        "become the sample(s); a None reward is left to the reward model (slime-rl's own).",
    )
    g.add_argument(
        "--dynamic-sampling-filter-path",
        type=str,
        default=None,
        help="fn(args, samples) -> bool | DynamicFilterOutput; dropped groups are replaced "
        "(e.g. slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std).",
    )
    g.add_argument(
        "--over-sampling-batch-size",
        type=int,
        default=None,
        help="Prompts fetched at a time while dynamic sampling refills (default --rollout-batch-size).",
    )
    g.add_argument(
        "--partial-rollout",
        action="store_true",
        help="When enough groups are done, abort the rest and keep their partial responses in the "
        "Data Buffer; the next rollout resumes them first.",
    )
    g.add_argument(
        "--mask-offpolicy-in-partial-rollout",
        action="store_true",
        help="With --partial-rollout: tokens generated before the resume (by older weights) get loss_mask 0.",
    )
    g.add_argument(
        "--max-weight-staleness",
        type=int,
        default=None,
        help="The fully async rollout (slime.rollout.fully_async_rollout): a group generated by weights "
        "more than this many updates older than the trainer's is dropped, not trained on, and "
        "counted (rollout/fully_async/dropped_stale_groups). Default: no bound.",
    )


def _add_sample_hook_arguments(g: argparse._ArgumentGroup) -> None:
    """Hooks on samples and train data, and custom rollout logging."""
    g.add_argument(
        "--rollout-sample-filter-path",
        type=str,
        default=None,
        help="fn(args, samples) that sets sample.remove_sample on samples not to train on "
        "(kept in their group and counted, loss mask zeroed).",
    )
    g.add_argument(
        "--custom-reward-post-process-path",
        type=str,
        default=None,
        help="fn(args, samples) -> (raw_rewards, rewards), replacing group normalisation.",
    )
    g.add_argument(
        "--custom-convert-samples-to-train-data-path",
        type=str,
        default=None,
        help="fn(args, samples) -> train data dict (tokens, response_lengths, loss_masks, rewards, ...), "
        "replacing the conversion, rewards included (slime's contract).",
    )
    g.add_argument(
        "--rollout-data-postprocess-path",
        type=str,
        default=None,
        help="fn(args, rollout_id, rollout_data), on each trainer rank after advantages.",
    )
    # slime's hooks around the default rollout and its logging
    g.add_argument(
        "--rollout-sample-hook-path",
        action="append",
        default=[],
        help="hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None, sync or async, "
        "on each generated sample before its reward; may be repeated (applied in order). None keeps "
        "the sample (changed in place or not), a Sample replaces it; an exception fails that sample.",
    )
    g.add_argument(
        "--rollout-all-samples-process-path",
        type=str,
        default=None,
        help="fn(args, all_samples, data_source) at the end of the default rollout: every finished group, "
        "the ones the dynamic-sampling filter dropped included.",
    )
    g.add_argument(
        "--custom-rollout-log-function-path",
        type=str,
        default=None,
        help="fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool; True skips the "
        "default rollout metrics.",
    )
    g.add_argument(
        "--custom-eval-rollout-log-function-path",
        type=str,
        default=None,
        help="fn(rollout_id, args, data, extra_metrics) -> bool; True skips the default eval metrics.",
    )


def _add_reward_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rewards")
    g.add_argument(
        "--rm-type",
        type=str,
        default=None,
        help="Built-in reward: math, deepscaler, dapo, f1, gpqa, ifbench, math_verify, remote_rm, code, random; "
        "a boxed_ prefix grades the last \\boxed{} content.",
    )
    g.add_argument(
        "--custom-rm-path",
        type=str,
        default=None,
        help="Reward function async rm(args, sample) -> float (with --group-rm: the group's samples -> a list), used"
        " instead of --rm-type.",
    )
    g.add_argument("--reward-key", type=str, default=None, help="Key of a dict reward to train on.")
    g.add_argument(
        "--eval-reward-key",
        type=str,
        default=None,
        help="Key of a dict reward that evaluation reports (default: --reward-key), as slime's.",
    )
    g.add_argument(
        "--group-rm",
        action="store_true",
        help="Call the reward (--custom-rm-path or --rm-type) once per group with the whole group.",
    )
    g.add_argument("--rm-url", type=str, default=None, help="The reward service of --rm-type remote_rm.")
    g.add_argument("--rm-timeout", type=float, default=120.0, help="Seconds per remote_rm request.")
    g.add_argument("--rm-max-retries", type=int, default=10, help="remote_rm attempts per sample, in all.")
    g.add_argument(
        "--rm-retry-interval",
        type=float,
        default=1.0,
        help="remote_rm back-off: this many seconds x 2^attempt (at most 30).",
    )
    g.add_argument(
        "--math-grader-timeout",
        type=float,
        default=5.0,
        help="--rm-type math / deepscaler / math_verify: seconds a grade's sympy or math-verify work "
        "may take in its worker process; past it the worker is killed and the answer scores 0, "
        "the reason in metadata['reward_error'].",
    )
    _add_sandbox_arguments(g)


def _add_sandbox_arguments(g: argparse._ArgumentGroup) -> None:
    """--rm-type code's sandbox (slime.sandbox): its limits and where it may run."""
    g.add_argument("--sandbox-timeout", type=float, default=10.0, help="--rm-type code: wall seconds per run.")
    g.add_argument("--sandbox-cpu-time", type=float, default=5.0, help="--rm-type code: CPU seconds per run.")
    g.add_argument(
        "--sandbox-memory-mb",
        type=int,
        default=1024,
        help="--rm-type code: memory of a program's processes all together (a cgroup: with the files it keeps "
        "in memory, no swap; past it the kernel kills the program), and each process's address space.",
    )
    g.add_argument("--sandbox-concurrency", type=int, default=2, help="--rm-type code: programs run at once.")
    g.add_argument("--sandbox-file-mb", type=int, default=16, help="--rm-type code: largest file a program may write.")
    g.add_argument(
        "--sandbox-scratch-mb",
        type=int,
        default=64,
        help="--rm-type code: size of the program's only writable directory (a tmpfs).",
    )
    g.add_argument(
        "--sandbox-processes",
        type=int,
        default=32,
        help="--rm-type code: processes and threads a program may have at once, all together (a pids cgroup).",
    )
    g.add_argument("--sandbox-open-files", type=int, default=64, help="--rm-type code: open files per process.")
    g.add_argument(
        "--sandbox-max-output-kb",
        type=int,
        default=1024,
        help="--rm-type code: a program writing more than this to stdout or stderr is killed.",
    )
    g.add_argument(
        "--sandbox-allow-unisolated",
        action="store_true",
        help="--rm-type code: where bubblewrap cannot isolate programs, run them as plain child processes "
        "(rlimits and an audit hook only; NOT a sandbox) instead of refusing to start.",
    )


def _check_sampling(args: argparse.Namespace) -> None:
    """SGLang's ranges for the sampling options (its SamplingParams.verify), at parse time: a bad
    value stops the run here, not as failed requests after the engines started. Training rollouts
    also refuse temperature 0 (slime's rule): greedy decoding is not a distribution the policy
    gradient can train (every sample of a group alike); evaluation may be greedy."""
    if not (math.isfinite(args.rollout_temperature) and args.rollout_temperature > 0):
        raise SlimeError(
            f"--rollout-temperature must be > 0, got {args.rollout_temperature}: temperature 0 is greedy decoding, "
            "which is not a valid RL policy (for greedy evaluation, set --eval-temperature 0)"
        )
    for prefix in ("rollout", "eval"):
        temperature, top_p, top_k = (
            getattr(args, f"{prefix}_{name}", None) for name in ("temperature", "top_p", "top_k")
        )
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise SlimeError(f"--{prefix}-temperature must be >= 0 (0: greedy), got {temperature}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise SlimeError(f"--{prefix}-top-p must be in (0, 1], got {top_p}")
        if top_k is not None and (top_k == 0 or top_k < -1):
            raise SlimeError(f"--{prefix}-top-k must be -1 (disabled) or >= 1, got {top_k}")


def finalize(args: argparse.Namespace) -> None:
    missing = [
        name
        for name, unset in (
            ("--rollout-batch-size", args.rollout_batch_size is None),
            ("--num-rollout (or --num-epoch)", args.num_rollout is None and args.num_epoch is None),
        )
        if unset
    ]
    if missing:  # all at once, not one per try
        raise SlimeError(" and ".join(missing) + (" are" if len(missing) > 1 else " is") + " required")
    require_positive(
        args,
        "rollout_batch_size",
        "n_samples_per_prompt",
        "rollout_max_response_len",
        "max_turns",
        "max_total_tokens",
        "over_sampling_batch_size",
    )
    # 0 is slime's eval-only run: the loop trains nothing, the policy is evaluated once (slime.train)
    if args.num_rollout is not None and args.num_rollout < 0:
        raise SlimeError(f"--num-rollout must be >= 0 (0: evaluate only), got {args.num_rollout}")
    _finalize_context(args)
    _check_sampling(args)
    if not 0.0 <= args.max_failed_sample_ratio <= 1.0:
        raise SlimeError(f"--max-failed-sample-ratio must be in [0, 1], got {args.max_failed_sample_ratio}")
    if args.over_sampling_batch_size is not None and not (args.dynamic_sampling_filter_path or args.partial_rollout):
        raise SlimeError(
            "--over-sampling-batch-size only applies with --dynamic-sampling-filter-path or --partial-rollout"
        )
    if args.mask_offpolicy_in_partial_rollout and not args.partial_rollout:
        raise SlimeError("--mask-offpolicy-in-partial-rollout needs --partial-rollout")
    if args.agent_function_path and not args.custom_generate_function_path:
        raise SlimeError(
            "--agent-function-path needs --custom-generate-function-path slime.agent.generate.generate "
            "(or a generate hook of yours that runs the agent)"
        )
    if args.max_weight_staleness is not None and args.max_weight_staleness < 0:
        raise SlimeError(
            f"--max-weight-staleness must be >= 0 (0: only on-policy groups), got {args.max_weight_staleness}"
        )
    if args.max_weight_staleness is not None and "fully_async" not in args.rollout_function_path:
        raise SlimeError(
            f"--max-weight-staleness applies to the fully async rollout (--rollout-function-path "
            f"slime.rollout.fully_async_rollout.generate_rollout), not to {args.rollout_function_path}"
        )
    _check_rewards(args)


def _finalize_context(args: argparse.Namespace) -> None:
    """slime's rule: with a context limit, prompts get at most context - 1 tokens, so at least one
    token is generated (and trained on)."""
    context = args.rollout_max_context_len
    if context is None:
        return
    if context < 2:
        raise SlimeError(f"--rollout-max-context-len must be >= 2 (a prompt token and a generated one), got {context}")
    if args.rollout_max_prompt_len is None:
        args.rollout_max_prompt_len = context - 1
    elif args.rollout_max_prompt_len > context - 1:
        raise SlimeError(
            f"--rollout-max-prompt-len {args.rollout_max_prompt_len} must be < --rollout-max-context-len "
            f"{context}, so that at least one token is generated"
        )


def _check_rewards(args: argparse.Namespace) -> None:
    for name in (
        "rm_timeout",
        "rm_max_retries",
        "sandbox_timeout",
        "sandbox_cpu_time",
        "sandbox_memory_mb",
        "sandbox_concurrency",
        "sandbox_file_mb",
        "sandbox_scratch_mb",
        "sandbox_processes",
        "sandbox_open_files",
        "sandbox_max_output_kb",
    ):
        if not 0 < getattr(args, name) < math.inf:  # nan fails too
            raise SlimeError(f"{flag(name)} must be a finite number > 0, got {getattr(args, name)}")
    if not 0 < args.math_grader_timeout < math.inf:  # nan and inf too: a grade must end
        raise SlimeError(
            f"--math-grader-timeout must be a finite number of seconds > 0, got {args.math_grader_timeout}"
        )
    rm_type = (args.rm_type or "").removeprefix("boxed_")
    if rm_type == "remote_rm" and not args.custom_rm_path:
        url = args.rm_url
        if not url or not url.startswith(("http://", "https://")):
            raise SlimeError(f"--rm-type remote_rm needs --rm-url http://HOST:PORT/PATH (got {url!r})")
