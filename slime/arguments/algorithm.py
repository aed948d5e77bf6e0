"""The RL algorithm: advantage estimator, policy loss and its corrections, KL, critic, distillation.
Incompatible combinations stop at parsing, each message naming both arguments."""

from __future__ import annotations

import argparse
import logging

from slime.algorithms.kl import KL_TYPES
from slime.arguments.checks import need

logger = logging.getLogger(__name__)

ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "ppo")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")
OPD_TYPES = ("sglang", "megatron")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("algorithm")
    _add_advantage_arguments(g)
    _add_policy_loss_arguments(g)
    _add_ppo_arguments(g)
    _add_mismatch_arguments(g)
    _add_distillation_and_custom_arguments(g)
    _add_reference_and_critic_arguments(g)
    _add_overlong_penalty_arguments(g)


def _add_advantage_arguments(g: argparse._ArgumentGroup) -> None:
    """Which advantages, and whether they are computed at all."""
    g.add_argument(
        "--advantage-estimator",
        choices=ADVANTAGE_ESTIMATORS,
        default="grpo",
        help="cispo: GRPO's advantages with MiniMax-M1's loss (clipped IS weight under stop-gradient "
        "times the log-prob); canonically --eps-clip 1.0 --eps-clip-high 4.0.",
    )
    g.add_argument(
        "--disable-compute-advantages-and-returns",
        action="store_false",
        dest="compute_advantages_and_returns",
        help="No old/reference log-probs, values, advantages or returns (SFT or a custom loss); "
        "--rollout-data-postprocess-path still runs and may set rollout_data['advantages'].",
    )
    g.add_argument(
        "--disable-grpo-std-normalization",
        action="store_false",
        dest="grpo_std_normalization",
        help="GRPO/GSPO subtract the group mean only (Dr. GRPO); slime's dest grpo_std_normalization.",
    )


def _add_policy_loss_arguments(g: argparse._ArgumentGroup) -> None:
    """The loss: PPO clip, KL and entropy terms, which log-probs, reward and advantage normalisation."""
    g.add_argument(
        "--loss-type",
        choices=LOSS_TYPES,
        default="policy_loss",
        help="policy_loss (RL), sft_loss (supervised on the response tokens) or custom_loss (--custom-loss-function-"
        "path).",
    )
    g.add_argument(
        "--eps-clip",
        type=float,
        default=0.2,
        help="PPO clip range: the probability ratio is clipped to [1 - eps, 1 + --eps-clip-high].",
    )
    g.add_argument("--eps-clip-high", type=float, default=None, help="Default: --eps-clip.")
    g.add_argument(
        "--use-kl-loss",
        action="store_true",
        help="Add the KL to a reference model (--ref-load) to the loss, weighted by --kl-loss-coef.",
    )
    g.add_argument("--kl-loss-coef", type=float, default=0.0, help="Weight of the KL loss (--use-kl-loss).")
    g.add_argument(
        "--kl-loss-type",
        choices=KL_TYPES,
        default="k1",
        help="KL estimator of the KL loss (k1: log-ratio, k2, k3: low-variance).",
    )
    g.add_argument(
        "--entropy-coef", type=float, default=0.0, help="Weight of the entropy bonus (subtracted from the loss)."
    )
    g.add_argument(
        "--calculate-per-token-loss",
        action="store_true",
        help="Average the loss over every token of the global batch, instead of per sample, then over samples.",
    )
    g.add_argument(
        "--use-rollout-logprobs",
        action="store_true",
        help="Use the engine's log-probs as the old policy instead of recomputing them.",
    )
    g.add_argument(
        "--use-rollout-entropy",
        action="store_true",
        help="Also compute the per-token entropy where old (rollout_data['entropy']) and reference "
        "(['ref_entropy']) log-probs are computed: for hooks (special loss masks) and "
        "rollout/entropy, rollout/ref_entropy.",
    )
    g.add_argument(
        "--disable-rewards-normalization",
        action="store_false",
        dest="rewards_normalization",
        help="Train on raw rewards (no group normalisation for grpo/gspo/rloo/reinforce_plus_plus_baseline); "
        "slime's dest rewards_normalization.",
    )
    g.add_argument(
        "--normalize-advantages", action="store_true", help="Whiten per-token advantages over the rollout (all ranks)."
    )


def _add_ppo_arguments(g: argparse._ArgumentGroup) -> None:
    """PPO and REINFORCE++: discount, GAE, dual clip, value clip, the KL penalty in the reward."""
    g.add_argument("--gamma", type=float, default=1.0, help="Discount (ppo GAE, reinforce_plus_plus).")
    g.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (ppo).")
    g.add_argument("--eps-clip-c", type=float, default=None, help="Dual-clip PPO lower bound (> 1).")
    g.add_argument("--value-clip", type=float, default=0.2, help="Clip of the critic's value loss (ppo).")
    g.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="KL-to-reference penalty in the per-token reward (ppo, reinforce_plus_plus[_baseline]).",
    )
    g.add_argument("--use-unbiased-kl", action="store_true", help="Importance-weight the KL loss by pi/pi_old.")


def _add_mismatch_arguments(g: argparse._ArgumentGroup) -> None:
    """Train/rollout mismatch (TIS, built in or custom; OPSM) and a custom pg-loss reduction."""
    g.add_argument("--use-tis", action="store_true", help="Truncated importance sampling for train/rollout mismatch.")
    g.add_argument(
        "--tis-clip", type=float, default=2.0, help="--use-tis: upper clip of the train/rollout probability ratio."
    )
    g.add_argument("--tis-clip-low", type=float, default=0.0, help="--use-tis: lower clip of that ratio.")
    g.add_argument(
        "--custom-tis-function-path",
        type=str,
        default=None,
        help="Replaces the TIS weighting of --use-tis: fn(args, *, pg_loss, train_log_probs, "
        "rollout_log_probs, loss_masks, total_lengths, response_lengths) -> "
        "(pg_loss, loss_masks, metrics).",
    )
    g.add_argument(
        "--custom-pg-loss-reducer-function-path",
        type=str,
        default=None,
        help="Reduces pg_loss only: fn(total_lengths, response_lengths, loss_masks, "
        "calculate_per_token_loss) -> reducer(per-token tensor) -> scalar sum (as slime's "
        "sum_of_sample_mean); the global-batch division follows.",
    )
    g.add_argument("--use-opsm", action="store_true", help="Off-policy sequence masking.")
    g.add_argument(
        "--opsm-delta",
        type=float,
        default=1e-4,
        help="--use-opsm: a negative-advantage sample whose mean log-ratio to the rollout policy exceeds this is "
        "masked.",
    )


def _add_distillation_and_custom_arguments(g: argparse._ArgumentGroup) -> None:
    """On-policy distillation, and custom loss and advantage functions."""
    g.add_argument("--use-opd", action="store_true", help="On-policy distillation (needs --opd-type).")
    g.add_argument(
        "--opd-type",
        choices=OPD_TYPES,
        default=None,
        help="megatron: teacher forward in the trainer (--opd-teacher-load); "
        "sglang: samples carry teacher_log_probs from the rollout.",
    )
    g.add_argument(
        "--opd-kl-coef", type=float, default=1.0, help="On-policy distillation: weight of the KL to the teacher."
    )
    g.add_argument("--opd-teacher-load", type=str, default=None, help="Teacher model directory (--opd-type megatron).")
    g.add_argument("--custom-loss-function-path", type=str, default=None, help="With --loss-type custom_loss.")
    g.add_argument(
        "--custom-advantage-function-path",
        type=str,
        default=None,
        help="fn(args, rollout_data) setting rollout_data['advantages'] and ['returns'].",
    )


def _add_reference_and_critic_arguments(g: argparse._ArgumentGroup) -> None:
    """The reference model, the old actor and the ppo critic."""
    g.add_argument(
        "--ref-update-interval",
        type=int,
        default=None,
        help="Copy the policy into the reference model every N rollouts.",
    )
    g.add_argument(
        "--keep-old-actor",
        action="store_true",
        help="Keep a copy of the weights the engines serve; old log-probs come from it.",
    )
    g.add_argument("--num-critic-only-steps", type=int, default=0, help="ppo: first N rollouts train the critic only.")
    g.add_argument("--critic-load", type=str, default=None, help="ppo critic backbone (default: --hf-checkpoint).")
    g.add_argument("--critic-lr", type=float, default=None, help="Default: --lr.")
    g.add_argument(
        "--critic-lr-warmup-iters", type=int, default=0, help="ppo: warm-up steps of the critic's learning rate."
    )


def _add_overlong_penalty_arguments(g: argparse._ArgumentGroup) -> None:
    """DAPO soft overlong penalty."""
    g.add_argument(
        "--overlong-buffer-len",
        type=int,
        default=None,
        help="DAPO soft overlong penalty over the last N tokens of --rollout-max-response-len.",
    )
    g.add_argument(
        "--overlong-penalty-factor",
        type=float,
        default=1.0,
        help="Weight of the DAPO overlong penalty (--overlong-buffer-len): up to this much reward is taken, linearly"
        " over the buffer.",
    )


def finalize(args: argparse.Namespace) -> None:
    """Defaults that follow other arguments, and the cross-argument checks of the algorithm suite."""
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    _check_losses(args)
    _check_corrections(args)
    _check_reference_and_critic(args)
    if args.use_opd:
        need(
            args.opd_type is not None,
            "--use-opd needs --opd-type (megatron: teacher in the trainer; sglang: from rollout)",
        )
        if args.opd_type == "megatron":
            need(args.opd_teacher_load is not None, "--opd-type megatron needs --opd-teacher-load (the teacher model)")
    else:
        need(args.opd_type is None and args.opd_teacher_load is None, "--opd-type / --opd-teacher-load need --use-opd")
    if args.overlong_buffer_len is not None:
        need(
            args.rollout_max_response_len is not None,
            "--overlong-buffer-len needs --rollout-max-response-len "
            "(the penalty counts from the end of the response budget)",
        )
        need(
            1 <= args.overlong_buffer_len <= args.rollout_max_response_len,
            f"--overlong-buffer-len ({args.overlong_buffer_len}) must be in [1, --rollout-max-response-len "
            f"({args.rollout_max_response_len})]",
        )


def _check_losses(args: argparse.Namespace) -> None:
    est, loss = args.advantage_estimator, args.loss_type
    need(
        (loss == "custom_loss") == (args.custom_loss_function_path is not None),
        "--loss-type custom_loss and --custom-loss-function-path go together",
    )
    if args.custom_pg_loss_reducer_function_path is not None:
        need(
            loss == "policy_loss",
            f"--custom-pg-loss-reducer-function-path reduces the policy loss; --loss-type {loss} has none",
        )
    if est == "cispo":
        need(
            args.eps_clip_c is None,
            "--eps-clip-c (dual clip) bounds the PPO-clip loss; --advantage-estimator cispo does not use it",
        )
        if args.eps_clip < 1.0:  # slime warns too: the lower bound is still active
            logger.warning(
                "--advantage-estimator cispo is canonically single-sided, but --eps-clip %s keeps the "
                "lower clip bound %s active; set --eps-clip 1.0 (and e.g. --eps-clip-high 4.0)",
                args.eps_clip,
                1.0 - args.eps_clip,
            )
    if not args.compute_advantages_and_returns:
        _check_without_advantages(args)
    if loss == "sft_loss":
        for option, on in (
            ("--use-tis", args.use_tis),
            ("--use-opsm", args.use_opsm),
            ("--use-opd", args.use_opd),
            ("--use-kl-loss", args.use_kl_loss),
            ("--normalize-advantages", args.normalize_advantages),
            ("--custom-advantage-function-path", args.custom_advantage_function_path),
            ("--use-rollout-entropy", args.use_rollout_entropy),
        ):
            need(not on, f"{option} has no effect with --loss-type sft_loss (no advantages, no policy ratio)")
        need(est != "ppo", "--advantage-estimator ppo needs --loss-type policy_loss, not --loss-type sft_loss")
    need(
        args.eps_clip_c is None or args.eps_clip_c > 1.0,
        f"--eps-clip-c (dual clip) must be > 1.0, got {args.eps_clip_c}",
    )
    need(args.eps_clip > 0 and args.eps_clip_high > 0, "--eps-clip and --eps-clip-high must be > 0")
    need(
        0.0 <= args.gamma <= 1.0 and 0.0 <= args.lambd <= 1.0,
        f"--gamma ({args.gamma}) and --lambd ({args.lambd}) must be in [0, 1]",
    )


def _check_without_advantages(args: argparse.Namespace) -> None:
    """--disable-compute-advantages-and-returns skips every forward pass and estimator before the
    training steps; options that only act there would be silently ignored."""
    flag = "--disable-compute-advantages-and-returns"
    need(
        args.advantage_estimator != "ppo",
        f"--advantage-estimator ppo trains its critic on returns, which {flag} does not compute",
    )
    for option, on in (
        ("--use-kl-loss", args.use_kl_loss),
        ("--kl-coef", args.kl_coef != 0.0),
        ("--use-opd", args.use_opd),
        ("--normalize-advantages", args.normalize_advantages),
        ("--custom-advantage-function-path", args.custom_advantage_function_path),
        ("--keep-old-actor", args.keep_old_actor),
        ("--use-rollout-entropy", args.use_rollout_entropy),
    ):
        need(not on, f"{option} acts where advantages are computed, which {flag} skips")
    if args.loss_type == "policy_loss":
        need(
            args.rollout_data_postprocess_path is not None,
            f"--loss-type policy_loss needs advantages, which {flag} does not compute: use --loss-type "
            f"sft_loss / custom_loss, or set rollout_data['advantages'] in --rollout-data-postprocess-path",
        )


def _check_corrections(args: argparse.Namespace) -> None:
    """Train/rollout mismatch corrections need the engine's log-probs."""
    sft_rollout = args.rollout_function_path.endswith("sft_rollout.generate_rollout")
    if args.use_tis or args.use_rollout_logprobs:
        option = "--use-tis" if args.use_tis else "--use-rollout-logprobs"
        need(
            not sft_rollout,
            f"{option} needs rollout log-probs, which --rollout-function-path "
            f"{args.rollout_function_path} (SFT data) does not produce",
        )
    need(
        args.custom_tis_function_path is None or args.use_tis,
        "--custom-tis-function-path replaces the weighting of --use-tis: add --use-tis",
    )
    need(
        args.tis_clip >= args.tis_clip_low >= 0,
        f"--tis-clip ({args.tis_clip}) must be >= --tis-clip-low ({args.tis_clip_low}) >= 0",
    )
    need(
        not (args.use_rollout_logprobs and args.keep_old_actor),
        "--use-rollout-logprobs and --keep-old-actor both choose the old policy; use one",
    )


def _check_reference_and_critic(args: argparse.Namespace) -> None:
    est = args.advantage_estimator
    # KL in the reward only enters estimators with per-token rewards
    if args.kl_coef != 0.0:
        need(
            est in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"),
            f"--kl-coef shapes per-token rewards of ppo / reinforce_plus_plus[_baseline]; "
            f"--advantage-estimator {est} ignores it (use --use-kl-loss with --kl-loss-coef)",
        )
    need(not args.use_unbiased_kl or args.use_kl_loss, "--use-unbiased-kl modifies the KL loss: add --use-kl-loss")
    if args.ref_update_interval is not None:
        need(args.ref_update_interval >= 1, f"--ref-update-interval must be >= 1, got {args.ref_update_interval}")
        need(
            args.use_kl_loss or args.kl_coef != 0.0,
            "--ref-update-interval needs a reference model: add --use-kl-loss or --kl-coef",
        )
    args.use_critic = est == "ppo"
    if args.use_critic:
        if args.critic_load is None:
            args.critic_load = args.hf_checkpoint
        need(
            args.critic_load is not None,
            "--advantage-estimator ppo needs a critic: give --critic-load (or --hf-checkpoint to start it from)",
        )
        if args.critic_lr is None:
            args.critic_lr = args.lr
    else:
        for option, on in (
            ("--num-critic-only-steps", args.num_critic_only_steps),
            ("--critic-load", args.critic_load),
            ("--critic-lr", args.critic_lr),
            ("--critic-lr-warmup-iters", args.critic_lr_warmup_iters),
        ):
            need(not on, f"{option} configures the critic, which only --advantage-estimator ppo uses (got {est})")
    need(args.num_critic_only_steps >= 0, "--num-critic-only-steps must be >= 0")
