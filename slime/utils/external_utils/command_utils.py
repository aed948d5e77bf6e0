"""slime's `slime.utils.external_utils.command_utils`: what slime's launch scripts (`scripts/run_*.py`)
call to prepare data and start training, with their CPU meaning here.

`execute_train` runs `python -m slime train` (or `train-async`, or the given script) with the
arguments and extra environment variables, in this process's environment; there is no Ray job to
submit and nothing to kill first (slime's stops stray sglang/ray processes on a dedicated GPU
node). The Megatron checkpoint conversion and the FP8 cast need slime's GPU tools and raise
SlimeError: this repo trains from the Hugging Face checkpoint itself.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.errors import SlimeError
from slime.utils.external_utils.typer_utils import dataclass_cli

__all__ = [
    "exec_command",
    "dataclass_cli",
    "convert_checkpoint",
    "rsync_simple",
    "hf_download_dataset",
    "fp8_cast_bf16",
    "ExecuteTrainConfig",
    "execute_train",
    "check_has_nvlink",
    "get_default_wandb_args",
    "create_run_id",
    "get_bool_env_var",
    "get_env_enable_infinite_run",
    "save_to_temp_file",
    "NUM_GPUS_OF_HARDWARE",
    "GENERATION_HARDWARE",
]

repo_base_dir = Path(__file__).resolve().parents[3]
NUM_GPUS_OF_HARDWARE = {"H100": 8, "GB200": 4, "GB300": 4}
GENERATION_HARDWARE = {"H100": "Hopper", "GB200": "Blackwell", "GB300": "Blackwell"}
_TRAIN_COMMANDS = {"train.py": ["train"], "train_async.py": ["train-async"]}


def exec_command(cmd: str, capture_output: bool = False, env: dict[str, str] | None = None) -> str | None:
    """Run `cmd` with bash (printed first); a failure raises CalledProcessError. With
    `capture_output`, its stdout."""
    print(f"EXEC: {cmd}", flush=True)
    try:
        result = subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output, text=True, env=env)
    except subprocess.CalledProcessError as e:
        if capture_output:
            print(f"{e.stdout=} {e.stderr=}")
        raise
    if capture_output:
        print(f"Captured stdout={result.stdout} stderr={result.stderr}")
        return result.stdout
    return None


def convert_checkpoint(
    model_name: str,
    megatron_model_type: str,
    num_gpus_per_node: int,
    multinode: bool = False,
    extra_args: str = "",
    dir_dst: str = "/root",
    hf_checkpoint: str | None = None,
) -> None:
    raise SlimeError(
        f"convert_checkpoint({model_name!r}): Megatron's torch_dist conversion runs slime's GPU tools; this repo "
        "trains from the Hugging Face checkpoint directly (--hf-checkpoint), so there is nothing to convert"
    )


def rsync_simple(path_src: str, path_dst: str) -> None:
    """Copy the contents of `path_src` into `path_dst` (created) with rsync."""
    exec_command(f"mkdir -p {shlex.quote(path_dst)} && rsync -a {shlex.quote(path_src)}/ {shlex.quote(path_dst)}")


def hf_download_dataset(full_name: str) -> None:
    """Download the Hugging Face dataset `owner/name` into `/root/datasets/<name>`."""
    _, name = full_name.split("/")
    exec_command(f"hf download --repo-type dataset {shlex.quote(full_name)} --local-dir /root/datasets/{name}")


def fp8_cast_bf16(path_src: str, path_dst: str) -> None:
    raise SlimeError(f"fp8_cast_bf16({path_src!r}): the FP8 -> BF16 cast is slime's GPU tool, not shipped here")


@dataclass
class ExecuteTrainConfig:
    """Options of `execute_train` a script may extend."""

    cuda_core_dump: bool = False
    num_nodes: int = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    extra_env_vars: str = ""


def _parse_extra_env_vars(text: str) -> dict[str, str]:
    """A JSON object, or `KEY=VALUE KEY2=VALUE2`."""
    try:
        return json.loads(text)
    except ValueError:
        return dict(item.split("=", 1) for item in text.split() if "=" in item)


def execute_train(
    train_args: str,
    num_gpus_per_node: int,
    megatron_model_type: str | None,
    train_script: str = "train.py",
    before_ray_job_submit: Callable[[], Any] | None = None,
    extra_env_vars: dict[str, str] | None = None,
    config: ExecuteTrainConfig | None = None,
) -> None:
    """Run the training with `train_args` (a shell-quoted string). `megatron_model_type` names
    slime's MODEL_ARGS file: here the model's shape comes from the checkpoint's config."""
    config = config or ExecuteTrainConfig()
    if before_ray_job_submit is not None:
        before_ray_job_submit()
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env_vars or {})
    env.update(_parse_extra_env_vars(config.extra_env_vars))
    if megatron_model_type is not None:
        print(f"execute_train: model type {megatron_model_type!r} is read from the checkpoint's config here")
    command = _TRAIN_COMMANDS.get(Path(train_script).name)
    head = [sys.executable, "-m", "slime", *command] if command else [sys.executable, train_script]
    exec_command(shlex.join(head) + " " + train_args, env=env)


def check_has_nvlink() -> bool:
    """Whether `nvidia-smi topo -m` shows NVLink connections (False without nvidia-smi)."""
    out = exec_command("nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l", capture_output=True)
    return int(out or 0) > 0


def create_run_id() -> str:
    """`<yymmdd-HHMMSS>-<3 random digits>`, UTC."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%y%m%d-%H%M%S")
    return f"{stamp}-{random.Random().randint(0, 999):03d}"


def get_default_wandb_args(test_file: str, run_name_prefix: str | None = None, run_id: str | None = None) -> str:
    """The `--use-wandb ...` options of a launch script's run (empty without WANDB_API_KEY)."""
    key = os.environ.get("WANDB_API_KEY")
    if not key:
        print("Skip wandb configuration since WANDB_API_KEY is not found")
        return ""
    path = Path(test_file)
    test_name = path.stem if len(path.stem) >= 6 else f"{path.parent.name}_{path.stem}"
    name = run_id or create_run_id()
    if (commit := os.environ.get("GITHUB_COMMIT_NAME")) is not None:
        name += f"_{commit}"
    if run_name_prefix is not None:
        name = f"{run_name_prefix}_{name}"
    return (
        f"--use-wandb --wandb-project slime-{test_name} --wandb-group {name} "
        f"--wandb-key {shlex.quote(key)} --disable-wandb-random-suffix "
    )


def get_bool_env_var(name: str, default: str = "false") -> bool:
    """True for "true"/"1" (any case); anything else is False ("false"/"0" silently)."""
    value = os.getenv(name, default).lower()
    if value not in ("true", "1", "false", "0"):
        print(f"get_bool_env_var({name}) see non-understandable value={value} and treat as false")
    return value in ("true", "1")


def get_env_enable_infinite_run() -> bool:
    return get_bool_env_var("SLIME_TEST_ENABLE_INFINITE_RUN", "false")


def save_to_temp_file(text: str, ext: str) -> str:
    """Write `text` to a new file under /tmp with extension `ext`; its path."""
    path = Path(f"/tmp/slime_temp_file_{time.time()}_{random.randrange(0, 10000000)}.{ext}")
    path.write_text(text)
    print(f"Write the following content to {path=}: {text=}")
    return str(path)
