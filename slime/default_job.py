"""The default job: `slime train` with no model or data given.

Builds (once) a tiny Qwen2-style model and the bundled addition task, then runs two stages
into one run directory:
  1. SFT warm start (`--loss-type sft_loss`), stopped well below mastery;
  2. GRPO on the same model, graded by the `math` reward (`\\boxed{}` answers).
Held-out accuracy (`eval/arith`) is measured before SFT, between the stages and at the end;
every metrics row names its stage.

Extra command-line arguments apply to the RL stage (`--run-dir`, `--use-tensorboard` and
`--seed` to both), so `slime train --num-rollout 50` shortens the RL stage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from slime.arguments import parse_args, to_argv
from slime.data.arithmetic import write_arithmetic_dataset
from slime.data.tiny_model import build_tiny_model
from slime.train import finish_run, run_cli, train
from slime.utils.checkpoint_layout import iter_dir
from slime.utils.misc import argv_value

SHARED_FLAGS = (
    "--run-dir",
    "--use-tensorboard",
    "--seed",
    "--colocate",
    "--use-wandb",
    "--wandb-project",
    "--wandb-team",
    "--wandb-group",
    "--wandb-mode",
    "--wandb-dir",
    "--wandb-key",
    "--wandb-host",
    "--tb-project-name",
    "--tb-experiment-name",
)


def assets_dir() -> Path:
    return Path(os.environ.get("SLIME_HOME", Path.home() / ".cache" / "slime-rl")) / "default"


def is_default_job(argv: Sequence[str]) -> bool:
    names = {a.split("=", 1)[0] for a in argv}
    return not names & {"--hf-checkpoint", "--prompt-data", "--config", "-h", "--help"}


def ensure_assets(root: Path) -> tuple[Path, Path]:
    """Tiny model and data set, built on first use (a few seconds)."""
    model_dir, data_dir = root / "tiny-model", root / "data"
    if not (model_dir / "config.json").exists():
        print(f"[slime] building the tiny model in {model_dir}", flush=True)
        build_tiny_model(model_dir, **TINY_MODEL)
    if not (data_dir / "eval.jsonl").exists():
        print(f"[slime] writing the addition task in {data_dir}", flush=True)
        write_arithmetic_dataset(data_dir, **TASK)
    return model_dir, data_dir


TINY_MODEL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192
)
TASK = dict(difficulty=2, num_eval=200, seed=0)

COMMON = dict(
    eval_input_key="prompt",
    eval_label_key="label",
    apply_chat_template=True,
    rollout_shuffle=True,
    eval_function_path="slime.rollout.sglang_rollout.generate_rollout",
    rm_type="math",
    rollout_max_response_len=8,
    eval_temperature=0.0,
    n_samples_per_eval_prompt=1,
    # the job's own optimizer settings, whatever the defaults
    colocate=True,
    adam_beta2=0.999,
    clip_grad=1.0,
    lr_decay_style="constant",
    weight_decay=0.0,
    # --colocate turns both offloads on (slime's rule, for GPU memory); on a CPU nothing needs that memory
    # back between the turns and returning it costs page faults every step (bench/step_profile.py)
    no_offload_train=True,
    no_offload_rollout=True,
)
SFT = dict(
    stage="sft",
    loss_type="sft_loss",
    rollout_function_path="slime.rollout.sft_rollout.generate_rollout",
    input_key="messages",
    num_rollout=140,
    rollout_batch_size=256,
    n_samples_per_prompt=1,
    global_batch_size=256,
    micro_batch_size=256,
    lr=3e-3,
    eval_interval=70,
    save_interval=140,  # the RL stage starts from the last SFT checkpoint (slime saves only on an interval)
)
RL = dict(
    stage="rl",
    input_key="prompt",
    label_key="label",
    advantage_estimator="grpo",
    num_rollout=500,
    rollout_batch_size=32,
    n_samples_per_prompt=8,
    global_batch_size=256,
    micro_batch_size=256,
    lr=3e-4,
    eps_clip=0.2,
    rollout_temperature=1.0,
    eval_interval=50,
    save_interval=500,  # the last rollout (slime's rule saves it whenever an interval is set)
)


def _shared(argv: Sequence[str]) -> list[str]:
    """The user's flags that apply to every stage (with their values)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in SHARED_FLAGS:
            out.append(argv[i])
            if "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append(argv[i + 1])
                i += 1
        i += 1
    return out


def run_default_job(argv: Sequence[str]) -> int:
    def body() -> None:
        user = list(argv)
        if not any(a.split("=", 1)[0] == "--run-dir" for a in user):
            user += ["--run-dir", os.path.join("runs", "default-" + time.strftime("%Y%m%d-%H%M%S"))]
        shared = _shared(user)
        model_dir, data_dir = ensure_assets(assets_dir())
        base = to_argv(COMMON) + [
            "--eval-prompt-data",
            "arith",
            str(data_dir / "eval.jsonl"),
            "--hf-checkpoint",
            str(model_dir),
        ]
        ckpts = Path(parse_args(base + to_argv(RL) + shared).run_dir) / "checkpoints"
        sft_args = parse_args(
            base + to_argv(SFT) + shared + ["--prompt-data", str(data_dir / "sft.jsonl"), "--save", str(ckpts / "sft")]
        )
        # Both stages are parsed before anything runs: a typo in the user's arguments costs no SFT time.
        sft_ckpt = iter_dir(ckpts / "sft", sft_args.num_rollout - 1)
        if argv_value(user, "--train-backend") == "megatron":  # the RL stage's trainer only
            print(
                "[slime] --train-backend megatron: the RL stage trains on megatron-core (its checkpoints are "
                "Megatron's torch_dist beside the HF files); the SFT stage stays on fsdp",
                flush=True,
            )
        rl_args = parse_args(
            base
            + to_argv(RL)
            + [
                "--prompt-data",
                str(data_dir / "train.jsonl"),
                "--skip-eval-before-train",
                "--hf-checkpoint",
                str(sft_ckpt),
                "--save",
                str(ckpts / "rl"),
            ]
            + user
        )

        t0 = time.time()
        train(sft_args)
        train(rl_args)
        finish_run(rl_args)
        print(f"[slime] default job finished in {time.time() - t0:.0f} s")

    return run_cli(body)
