"""Benchmark: slime-rl against Hugging Face TRL's `GRPOTrainer`, side by side, on the same job.

    .venv/bin/python bench/vs_trl.py [--quick] [--steps 200] [--rounds 2]
    .venv/bin/python bench/vs_trl.py --check          # loss / advantage consistency on one batch, then exit
    .venv/bin/python bench/vs_trl.py --install-only   # create .venv-trl and exit

TRL lives in its own virtual environment, `.venv-trl/` (git-ignored), with torch pinned to this
project's CPU 2.13.0 wheel (the project's constraints.txt on every pip call) and TRL's own pins
(`TRL_PINS`). The script creates it on first use (`--no-install`: only say how) and runs TRL in it as
a subprocess: this file is also TRL's worker (`--trl-worker ...`), importing only torch, transformers,
datasets and trl there.

The same job for everyone: one local model directory (the default job's tiny Qwen2 after its SFT
stage, built once into --work-dir), the bundled addition task (train.jsonl for training, the 200
held-out problems of eval.jsonl for accuracy), reward 1 for the right `\\boxed{}` answer, 32 prompts x
8 samples per step, 8 new tokens, temperature 1, lr 3e-4 constant (no warm-up, no decay), AdamW
(0.9, 0.999, eps 1e-8, no weight decay), gradient clipping 1.0, PPO clip 0.2, no KL, GRPO advantages
(group mean and std), per-sample loss (each sample's token mean, averaged over samples), one
optimizer step per rollout, fp32, 2 threads each. Five systems (more on request), alternating round
by round with a fixed seed per round:

* TRL 1.16 `GRPOTrainer` (use_cpu, no vLLM, bf16 off, gradient checkpointing off, every default that
  differs from the above set explicitly: see `trl_config`);
* slime-rl `slime train --colocate` (the default job's placement: engine and trainer take turns on
  both cores);
* slime-rl `slime train-async` (one step off policy; engine and trainer on one core each, the
  engine's core lent to the trainer while the engine is idle);
* slime-rl `slime train-async --use-tis`: slime's truncated importance sampling against the
  generating policy's log-probs, the correction for train_async's one-version lag;
* TRL again with slime-rl's MKL vendor shim preloaded into its process (`trl-mkl`; only where the
  shim applies, see slime/runtime/mkl_vendor.py): slime-rl's processes get the shim by default, so this
  row separates what the framework brings from what the kernel choice brings;
* on request (`--systems ... async-plain`): train_async with `--no-lend-idle-cores
  --no-share-prompt-forward`, to measure what those two bring, side by side; `async-no-shim`:
  train_async with `--no-mkl-vendor-shim`.

Per system: median seconds per step (TRL: on_step_begin to on_step_end, generation included, first
step left out; slime-rl: `perf/step_time`, first and last (checkpoint) step left out), rollout
tokens/s (completion tokens / generation time), mean training reward over the last fifth of the
steps, held-out greedy accuracy before and after (the same evaluator for everyone: HF `generate`,
greedy, 8 new tokens, slime's `math` grader), the ratio to TRL, and both configurations.

`--check`: on one identical batch (same prompts, completions, old log-probs, rewards, model) the
advantages and the loss of TRL's own code (`GRPOTrainer._generate_and_score_completions` with the
generation replaced by the fixed batch, then `GRPOTrainer._compute_loss`) and of slime-rl's
(`post_process_rewards`, `compute_advantages_and_returns`, `policy_loss`) must agree to 1e-5 for the
loss types both define (tests/algorithms/test_vs_trl_consistency.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
TRL_VENV = REPO / ".venv-trl"
TRL_PYTHON = TRL_VENV / "bin" / "python"
TRL_VERSION = "1.16.0"
# With the project's constraints.txt (torch 2.13.0 CPU, transformers 5.24, ...) on the same pip call.
TRL_PINS = [f"trl=={TRL_VERSION}", "accelerate==1.15.0", "datasets==5.2.0", "peft==0.21.2"]
INSTALL_HOWTO = (
    f"python3 -m venv .venv-trl && .venv-trl/bin/pip install -c constraints.txt {' '.join(TRL_PINS)} && "
    ".venv-trl/bin/pip uninstall -y torchvision torchaudio torchcodec   (from the repository root; ~1.5 min, ~1.5 GB)"
)
CHECK_TOL = 1e-5
TRL_MKL_SUFFIX = " + MKL vendor shim"

# The job both systems run: the default job's RL stage; `--model 25m` changes the model and the batch.
JOB = dict(
    prompts=32,
    samples=8,
    new_tokens=8,
    lr=3e-4,
    eps_clip=0.2,
    temperature=1.0,
    adam_beta1=0.9,
    adam_beta2=0.999,
    adam_eps=1e-8,
    weight_decay=0.0,
    clip_grad=1.0,
    threads=2,
    lora_rank=0,  # --lora-rank R: a LoRA adapter (alpha 2R, every linear layer of the decoder) for everyone
)
# The other comparisons (`--model 25m`, `150m`, `190m`): bench/lora.py's Qwen2-style models (random init, the
# default job's tokenizer; ~25M parameters, and ~6x / ~7.5x that), 8 prompts x 8 samples, 32 new tokens. No SFT
# stage (it would take longer than the benchmark): the rows are about speed; held-out accuracy stays ~0.
MODELS = {
    "tiny": {},
    "25m": dict(prompts=8, samples=8, new_tokens=32),
    "150m": dict(prompts=8, samples=8, new_tokens=32),
    "190m": dict(prompts=8, samples=8, new_tokens=32),
}

# GRPOConfig fields this script sets, and GRPOTrainer methods the consistency check calls: the API probe.
TRL_CONFIG_FIELDS = [
    "use_cpu",
    "bf16",
    "fp16",
    "use_vllm",
    "gradient_checkpointing",
    "report_to",
    "save_strategy",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "steps_per_generation",
    "num_iterations",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "beta",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "importance_sampling_level",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "entropy_coef",
    "shuffle_dataset",
    "max_steps",
    "seed",
    "data_seed",
    "logging_steps",
    "disable_tqdm",
]
TRL_TRAINER_METHODS = ["_generate", "_generate_and_score_completions", "_compute_loss"]


# ------------------------------------------------------------------------------------------------
# TRL side: runs in .venv-trl (torch, transformers, datasets, trl only; never slime)
# ------------------------------------------------------------------------------------------------


def trl_config(
    out_dir: str,
    *,
    batch: int,
    samples: int,
    new_tokens: int,
    lr: float,
    steps: int,
    seed: int,
    loss_type: str = "grpo",
    scale_rewards: str = "group",
    epsilon: float = 0.2,
    epsilon_high: float | None = 0.2,
    importance_sampling_level: str = "token",
) -> dict:
    """GRPOConfig keyword arguments: every TRL default that differs from the shared job, set explicitly."""
    return dict(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        use_vllm=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        per_device_train_batch_size=batch * samples,
        gradient_accumulation_steps=1,
        num_generations=samples,
        steps_per_generation=1,
        num_iterations=1,  # one optimizer step per rollout (TRL: ratio exactly 1)
        max_completion_length=new_tokens,
        temperature=JOB["temperature"],
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,  # TRL default: linear decay, lr 1e-6
        weight_decay=JOB["weight_decay"],
        adam_beta1=JOB["adam_beta1"],
        adam_beta2=JOB["adam_beta2"],
        adam_epsilon=JOB["adam_eps"],
        max_grad_norm=JOB["clip_grad"],
        optim="adamw_torch",
        beta=0.0,  # no KL (TRL's default too)
        loss_type=loss_type,  # TRL default "dapo"; "grpo" = slime's per-sample loss
        scale_rewards=scale_rewards,  # "group" = slime's --grpo-std-normalization (default)
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        importance_sampling_level=importance_sampling_level,
        mask_truncated_completions=False,
        top_entropy_quantile=1.0,
        entropy_coef=0.0,
        shuffle_dataset=True,
        max_steps=steps,
        seed=seed,
        data_seed=seed,
    )


def _boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (balanced braces), else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _trl_train(cfg: dict) -> None:
    import torch

    torch.set_num_threads(cfg["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in Path(cfg["train"]).read_text().splitlines() if line.strip()]
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "label": str(r["label"])} for r in rows]
    )

    def boxed_reward(completions, label, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if (_boxed(t) or "").strip() == str(y).strip() else 0.0 for t, y in zip(texts, label, strict=True)]

    gen: dict[str, list[float]] = {"seconds": [], "tokens": []}

    class Timed(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            gen["seconds"].append(time.perf_counter() - t0)
            gen["tokens"].append(float(sum(len(ids) for ids in out[1])))
            return out

    steps: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            steps.append(time.perf_counter() - self.t0)

    tok = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    peft_config = None
    if cfg.get("lora_rank"):  # TRL's own LoRA: peft's LoraConfig handed to GRPOTrainer
        from peft import LoraConfig

        r = cfg["lora_rank"]
        peft_config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear", bias="none")
    kwargs = trl_config(
        str(Path(cfg["out"]) / "trainer"),
        batch=cfg["prompts"],
        samples=cfg["samples"],
        new_tokens=cfg["new_tokens"],
        lr=cfg["lr"],
        steps=cfg["steps"],
        seed=cfg["seed"],
    )
    t0 = time.perf_counter()
    trainer = Timed(
        model=model,
        reward_funcs=boxed_reward,
        args=GRPOConfig(**kwargs),
        train_dataset=ds,
        processing_class=tok,
        callbacks=[StepTimer()],
        peft_config=peft_config,
    )
    trainer.train()
    wall = time.perf_counter() - t0
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)  # LoRA: the adapter's
    if peft_config is not None:  # the merged model, what the held-out evaluation loads
        trainer.model.merge_and_unload().save_pretrained(str(Path(cfg["out"]) / "model"))
    else:
        trainer.save_model(str(Path(cfg["out"]) / "model"))
    tok.save_pretrained(str(Path(cfg["out"]) / "model"))
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    import transformers
    import trl

    result = {
        "step_s": steps,
        "gen_s": gen["seconds"],
        "gen_tokens": gen["tokens"],
        "rewards": rewards,
        "wall_s": wall,
        "config": {k: v for k, v in kwargs.items() if k != "output_dir"},
        "trained_params": trained,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }
    Path(cfg["out"], "result.json").write_text(json.dumps(result))


def _trl_check(batch_path: str, out_path: str) -> None:
    """TRL's own advantage and loss code on the fixed batch, once per configuration."""
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    b = json.loads(Path(batch_path).read_text())
    n_prompts, g = b["prompts"], b["samples"]
    tok = AutoTokenizer.from_pretrained(b["model"])
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for case in b["cases"]:
            model = AutoModelForCausalLM.from_pretrained(b["model"], dtype=torch.float32)
            kwargs = trl_config(
                d, batch=n_prompts, samples=g, new_tokens=b["max_new_tokens"], lr=1e-6, steps=1, seed=0, **case["trl"]
            )

            def fixed_reward(completions, fixed_reward, **_):
                return [float(r) for r in fixed_reward]

            ds = Dataset.from_list([{"prompt": "x", "fixed_reward": 0.0}] * (n_prompts * g))
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=fixed_reward,
                args=GRPOConfig(**kwargs),
                train_dataset=ds,
                processing_class=tok,
            )

            def fixed_generation(prompts, _b=b):  # the rollout: the batch's own completions
                texts = [tok.decode(ids) for ids in _b["completion_ids"]]
                return _b["prompt_ids"], _b["completion_ids"], None, texts, None, {}, None, None

            trainer._generate = fixed_generation
            trainer.model.train()
            if getattr(trainer, "current_gradient_accumulation_steps", None) is None:
                trainer.current_gradient_accumulation_steps = 1
            inputs = [{"prompt": "x", "fixed_reward": r} for r in b["rewards"]]
            out = trainer._generate_and_score_completions(inputs)
            width = out["completion_ids"].shape[1]
            old = torch.zeros(len(b["old_log_probs"]), width)
            for i, lp in enumerate(b["old_log_probs"]):
                old[i, : len(lp)] = torch.tensor(lp)
            out["old_per_token_logps"] = old
            loss = trainer._compute_loss(trainer.model, out)
            results[case["name"]] = {"advantages": out["advantages"].reshape(-1).tolist(), "loss": float(loss.detach())}
    Path(out_path).write_text(json.dumps(results))


PROBE = f"""
import dataclasses, json, sys
missing = []
try:
    import torch, transformers, trl, datasets, accelerate, peft
except ImportError as e:
    print(json.dumps({{"ok": False, "missing": "module " + repr(e.name)}})); sys.exit(0)
try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:
    print(json.dumps({{"ok": False, "missing": "trl.GRPOConfig / trl.GRPOTrainer (" + str(e) + ")",
                      "trl": trl.__version__}})); sys.exit(0)
fields = {{f.name for f in dataclasses.fields(GRPOConfig)}}
missing += ["GRPOConfig." + f for f in {TRL_CONFIG_FIELDS!r} if f not in fields]
missing += ["GRPOTrainer." + m for m in {TRL_TRAINER_METHODS!r} if not hasattr(GRPOTrainer, m)]
print(json.dumps({{"ok": not missing, "missing": ", ".join(missing), "trl": trl.__version__,
                  "torch": torch.__version__, "transformers": transformers.__version__}}))
"""


# ------------------------------------------------------------------------------------------------
# slime-rl side (this project's .venv)
# ------------------------------------------------------------------------------------------------


def use_trl_venv(path: Path) -> None:
    global TRL_VENV, TRL_PYTHON
    TRL_VENV = path.resolve()
    TRL_PYTHON = TRL_VENV / "bin" / "python"


def trl_status() -> dict:
    """{"ok": bool, "missing": "...", versions...}: is TRL there, with the API this script uses?"""
    if not TRL_PYTHON.exists():
        return {"ok": False, "missing": f"the TRL virtual environment ({TRL_VENV} does not exist)"}
    proc = subprocess.run([str(TRL_PYTHON), "-c", PROBE], capture_output=True, text=True, timeout=300)
    try:
        status = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "missing": f"a working Python in {TRL_VENV} ({(proc.stderr or proc.stdout)[-300:]})"}
    if status.get("ok") and status.get("trl") != TRL_VERSION:
        status["note"] = f"TRL {status.get('trl')} found; this script was written against {TRL_VERSION}"
    return status


def install_trl() -> None:
    print(f"[vs_trl] creating {TRL_VENV} with TRL {TRL_VERSION} (torch pinned by constraints.txt) ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(TRL_VENV)],  # this project's Python version
        [str(TRL_VENV / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints.txt"), *TRL_PINS],
        [str(TRL_VENV / "bin" / "pip"), "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 and "uninstall" not in cmd:
            raise SystemExit(
                f"[vs_trl] installing TRL failed at `{' '.join(cmd)}`:\n{proc.stderr[-1500:]}\n"
                f"Install it by hand: {INSTALL_HOWTO}"
            )


def require_trl(install: bool) -> dict:
    status = trl_status()
    if not status["ok"] and install:  # absent, or broken / another TRL: (re)install the pinned set
        install_trl()
        status = trl_status()
    if not status["ok"]:
        found = f" (found TRL {status['trl']})" if status.get("trl") else ""
        raise SystemExit(
            f"[vs_trl] TRL is not usable: missing {status['missing']}{found}.\n"
            f"This script needs TRL {TRL_VERSION} in {TRL_VENV}. Install it with:\n  {INSTALL_HOWTO}"
        )
    if status.get("note"):
        print(f"[vs_trl] note: {status['note']}", flush=True)
    return status


def run_trl_worker(args: list[str], timeout: float | None = None, preload: dict[str, str] | None = None) -> None:
    """`preload`: extra environment (the MKL vendor shim's LD_PRELOAD, for the `trl-mkl` system)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(JOB["threads"]),
        "MKL_NUM_THREADS": str(JOB["threads"]),
        **(preload or {}),
    }
    proc = subprocess.run(
        [str(TRL_PYTHON), str(Path(__file__).resolve()), "--trl-worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"[vs_trl] the TRL run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


# ---- the consistency check -----------------------------------------------------------------------

CHECK_CASES = [
    # name, TRL GRPOConfig fields, slime-rl options
    ("grpo, per-sample loss, std-normalised advantages", dict(loss_type="grpo", scale_rewards="group"), []),
    (
        "grpo, per-sample loss, mean-only advantages (Dr.GRPO)",
        dict(loss_type="grpo", scale_rewards="none"),
        ["--disable-grpo-std-normalization"],
    ),
    (
        "dapo, per-token loss, clip-higher 0.28",
        dict(loss_type="dapo", scale_rewards="none", epsilon_high=0.28),
        ["--disable-grpo-std-normalization", "--calculate-per-token-loss", "--eps-clip-high", "0.28"],
    ),
    ("bnpo, per-token loss", dict(loss_type="bnpo", scale_rewards="group"), ["--calculate-per-token-loss"]),
    (
        "gspo, sequence-level ratio",
        dict(loss_type="grpo", scale_rewards="none", importance_sampling_level="sequence"),
        ["--advantage-estimator", "gspo", "--disable-grpo-std-normalization"],
    ),
    (
        "cispo, ratio clipped at 1.2 (TRL epsilon_high=1.2; slime --eps-clip 1 --eps-clip-high 0.2)",
        dict(loss_type="cispo", scale_rewards="none", epsilon_high=1.2),
        [
            "--advantage-estimator",
            "cispo",
            "--disable-grpo-std-normalization",
            "--calculate-per-token-loss",
            "--eps-clip",
            "1.0",
            "--eps-clip-high",
            "0.2",
        ],
    ),
]
TRL_ADV_EPS = 1e-4  # TRL divides by (std + 1e-4); slime (and so slime-rl) by (std + 1e-6)


def make_check_batch(
    model_dir: Path, data_dir: Path, prompts: int = 4, samples: int = 4, max_new: int = 8, seed: int = 0
) -> dict:
    """Real prompts (chat template), random completions of 1..max_new tokens, old log-probs = the model's
    own log-probs plus noise (so that ratios differ from 1 and some are clipped), rewards with a
    0/1 group, a fractional group and an all-equal group."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.backends.torch.batching import build_micro_batch, response_log_probs

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()[:prompts]]
    gen = torch.Generator().manual_seed(seed)
    prompt_ids, completion_ids, rewards = [], [], []
    for p, row in enumerate(rows):
        text = tok.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        for _ in range(samples):
            n = int(torch.randint(1, max_new + 1, (1,), generator=gen))
            prompt_ids.append(ids)
            completion_ids.append(torch.randint(0, len(tok), (n,), generator=gen).tolist())
            if p == prompts - 1:
                rewards.append(1.0)  # an all-equal group: advantage 0 in both
            elif p % 2:
                rewards.append(round(float(torch.rand((), generator=gen)), 3))
            else:
                rewards.append(float(torch.rand((), generator=gen) < 0.5))
    data = {
        "tokens": [a + b for a, b in zip(prompt_ids, completion_ids, strict=True)],
        "response_lengths": [len(c) for c in completion_ids],
        "loss_masks": [[1] * len(c) for c in completion_ids],
    }
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        lp, _ = response_log_probs(model, build_micro_batch(data, list(range(len(completion_ids))), packed=False))
    noise = 0.3 * torch.randn(lp.shape, generator=gen)
    old = (lp + noise).split(data["response_lengths"])
    return {
        "model": str(model_dir),
        "prompts": prompts,
        "samples": samples,
        "max_new_tokens": max_new,
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "rewards": rewards,
        "old_log_probs": [o.tolist() for o in old],
    }


def slime_check_case(batch: dict, options: list[str], data_file: Path, advantages_override: list[float] | None):
    """slime-rl's own path: post_process_rewards -> compute_advantages_and_returns -> policy_loss."""
    import torch
    from transformers import AutoModelForCausalLM

    from slime.arguments import parse_args
    from slime.backends.torch.batching import build_micro_batch, response_log_probs
    from slime.backends.torch.loss import policy_loss
    from slime.backends.torch.rollout_batch import RolloutBatch, compute_advantages_and_returns
    from slime.rollout.train_data import post_process_rewards
    from slime.utils.types import Sample

    n = len(batch["rewards"])
    args = parse_args(
        [
            "--hf-checkpoint",
            batch["model"],
            "--prompt-data",
            str(data_file),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--advantage-estimator",
            "grpo",
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            str(batch["prompts"]),
            "--n-samples-per-prompt",
            str(batch["samples"]),
            "--global-batch-size",
            str(n),
            "--micro-batch-size",
            str(n),
            "--eps-clip",
            "0.2",
            "--rollout-temperature",
            "1.0",
            *options,
        ]
    )
    samples = [Sample(reward=r, status=Sample.Status.COMPLETED) for r in batch["rewards"]]
    _, normalised = post_process_rewards(args, samples)
    old = [torch.tensor(o, dtype=torch.float32) for o in batch["old_log_probs"]]
    masks = [[1] * len(c) for c in batch["completion_ids"]]
    rollout = {"log_probs": old, "rewards": advantages_override or normalised, "loss_masks": masks}
    compute_advantages_and_returns(args, rollout)
    data = RolloutBatch(
        indices=list(range(n)),
        tokens=[a + b for a, b in zip(batch["prompt_ids"], batch["completion_ids"], strict=True)],
        response_lengths=[len(c) for c in batch["completion_ids"]],
        loss_masks=masks,
        rewards=list(rollout["rewards"]),
        rollout_mask_sums=[float(len(m)) for m in masks],
        old_log_probs=old,
        advantages=list(rollout["advantages"]),
    )
    model = AutoModelForCausalLM.from_pretrained(batch["model"], dtype=torch.float32)
    model.train()
    mb = build_micro_batch(data.sequences, list(range(n)), packed=False)
    log_probs, entropy = response_log_probs(model, mb, args.rollout_temperature, with_entropy=True)
    reduce_kw = dict(
        calculate_per_token_loss=args.calculate_per_token_loss,
        num_samples=n,
        num_tokens=float(sum(len(m) for m in masks)),
    )
    loss, parts = policy_loss(args, data, mb, log_probs, entropy, reduce_kw, [float(len(m)) for m in masks])
    return normalised, float(loss.detach()), float(parts["train/pg_clipfrac"])


def consistency_check(work: Path, install: bool) -> list[dict]:
    """Both sides on one batch; returns one row per case (`ok` when everything agrees to CHECK_TOL)."""
    import torch

    sys.path.insert(0, str(REPO))
    from slime.algorithms.advantages import group_normalize_rewards
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model

    require_trl(install)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "check-model"
    if not (model_dir / "config.json").exists():
        build_tiny_model(
            model_dir,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=192,
        )
    data_dir = work / "check-data"
    if not (data_dir / "train.jsonl").exists():
        write_arithmetic_dataset(data_dir, difficulty=2, num_eval=8, seed=0)
    batch = make_check_batch(model_dir, data_dir)
    batch["cases"] = [{"name": name, "trl": trl} for name, trl, _ in CHECK_CASES]
    (work / "check-batch.json").write_text(json.dumps(batch))
    run_trl_worker(["check", str(work / "check-batch.json"), str(work / "check-trl.json")], timeout=600)
    trl = json.loads((work / "check-trl.json").read_text())
    rows = []
    for name, trl_kw, options in CHECK_CASES:
        t = trl[name]
        t_adv = torch.tensor(t["advantages"])
        std_norm = trl_kw.get("scale_rewards") == "group"
        override = None
        if std_norm:  # the same formula with TRL's epsilon, so the loss comparison sees equal advantages
            override = group_normalize_rewards(
                torch.tensor(batch["rewards"]), batch["samples"], eps=TRL_ADV_EPS
            ).tolist()
        s_adv, s_loss, clipfrac = slime_check_case(batch, options, data_dir / "train.jsonl", override)
        adv_diff = float((torch.tensor(override if std_norm else s_adv) - t_adv).abs().max())
        eps_diff = float((torch.tensor(s_adv) - t_adv).abs().max()) if std_norm else adv_diff
        loss_diff = abs(s_loss - t["loss"])
        rows.append(
            {
                "case": name,
                "trl_loss": t["loss"],
                "slime_loss": s_loss,
                "loss_diff": loss_diff,
                "clipfrac": clipfrac,
                "adv_diff": adv_diff,
                "adv_diff_slime_eps": eps_diff,
                "std_normalised": std_norm,
                "ok": loss_diff <= CHECK_TOL and adv_diff <= CHECK_TOL,
            }
        )
    return rows


def print_check(rows: list[dict]) -> None:
    print(
        f"consistency: TRL {TRL_VERSION}'s GRPOTrainer code vs slime-rl's, one batch (4 prompts x 4 samples, "
        f"1-8 completion tokens, old log-probs = log-probs + N(0, 0.3^2) noise), tolerance {CHECK_TOL:g}"
    )
    print(
        "| case | TRL loss | slime-rl loss | loss difference | largest advantage difference | clipped tokens | agree |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['trl_loss']:.7f} | {r['slime_loss']:.7f} | {r['loss_diff']:.1e} "
            f"| {r['adv_diff']:.1e} | {r['clipfrac']:.0%} | {'yes' if r['ok'] else 'NO'} |"
        )
    std = [r for r in rows if r["std_normalised"]]
    if std:
        print(
            f"Std-normalised advantages: TRL divides by (std + {TRL_ADV_EPS:g}), slime and slime-rl by (std + 1e-6); "
            f"the rows above compare slime-rl's group_normalize_rewards with TRL's epsilon; with slime's own "
            f"epsilon the largest advantage difference is {max(r['adv_diff_slime_eps'] for r in std):.1e} "
            f"(that epsilon, nothing else)."
        )


# ---- the benchmark -------------------------------------------------------------------------------


def build_assets(work: Path, sft_steps: int, seed: int, model: str = "tiny") -> tuple[Path, Path]:
    """The default job's tiny model after (a possibly shorter) SFT stage, or the ~25M model as
    initialised, and the data; cached in `work`."""
    from slime.arguments import to_argv
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model
    from slime.default_job import COMMON, SFT, TASK, TINY_MODEL
    from slime.utils.checkpoint_layout import iter_dir

    data_dir = work / "data"
    if not (data_dir / "eval.jsonl").exists():
        write_arithmetic_dataset(data_dir, **TASK)
    if model != "tiny":
        from bench.lora import MODELS as SHAPES

        path = work / f"model-{model}"
        if not (path / "config.json").exists():
            build_tiny_model(path, **SHAPES[model])
        return path, data_dir
    sft_root = work / f"sft-{sft_steps}-seed{seed}"
    ckpt = iter_dir(sft_root / "checkpoints", sft_steps - 1)
    if (Path(ckpt) / "config.json").exists():
        return Path(ckpt), data_dir
    base = build_tiny_model(work / "tiny-model", **TINY_MODEL)
    print(f"[vs_trl] SFT warm start ({sft_steps} steps, the default job's stage 1) ...", flush=True)
    argv = (
        to_argv(COMMON)
        + to_argv(SFT)
        + [
            "--hf-checkpoint",
            str(base),
            "--prompt-data",
            str(data_dir / "sft.jsonl"),
            "--num-rollout",
            str(sft_steps),
            "--eval-prompt-data",
            "arith",
            str(data_dir / "eval.jsonl"),
            "--eval-interval",
            str(sft_steps),
            "--save-interval",
            str(sft_steps),
            "--save",
            str(sft_root / "checkpoints"),
            "--run-dir",
            str(sft_root / "run"),
            "--seed",
            str(seed),
        ]
    )
    proc = subprocess.run([sys.executable, "-m", "slime", "train", *argv], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[vs_trl] the SFT stage failed:\n{proc.stderr[-3000:]}")
    return Path(ckpt), data_dir


def slime_argv(model: Path, data_dir: Path, steps: int, seed: int, run_dir: Path) -> list[str]:
    j = JOB
    return [
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(data_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--advantage-estimator",
        "grpo",
        "--num-rollout",
        str(steps),
        "--rollout-batch-size",
        str(j["prompts"]),
        "--n-samples-per-prompt",
        str(j["samples"]),
        "--global-batch-size",
        str(j["prompts"] * j["samples"]),
        "--micro-batch-size",
        str(j["prompts"] * j["samples"]),
        "--rollout-max-response-len",
        str(j["new_tokens"]),
        "--rollout-temperature",
        str(j["temperature"]),
        "--lr",
        str(j["lr"]),
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        str(j["weight_decay"]),
        "--adam-beta1",
        str(j["adam_beta1"]),
        "--adam-beta2",
        str(j["adam_beta2"]),
        "--adam-eps",
        str(j["adam_eps"]),
        "--clip-grad",
        str(j["clip_grad"]),
        "--eps-clip",
        str(j["eps_clip"]),
        "--kl-coef",
        "0",
        "--entropy-coef",
        "0",
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
        "--save-interval",  # the last rollout's checkpoint only: the held-out evaluation reads it
        str(steps),
        "--save",
        str(run_dir / "checkpoints"),
        *(
            ["--enable-lora", "--lora-rank", str(j["lora_rank"]), "--lora-alpha", str(2 * j["lora_rank"])]
            if j["lora_rank"]
            else []
        ),
    ]


SLIME_MODES = {
    # --colocate turns both offloads on (slime's rule, for GPU memory); on the CPU nothing needs that memory
    # back and giving it to the system costs ~0.1 s a step in page faults (bench/step_profile.py): off, as
    # a CPU user would run it
    "slime-rl sync": (
        "train",
        [
            "--colocate",
            "--no-offload-train",
            "--no-offload-rollout",
            "--train-num-threads",
            "2",
            "--sglang-num-threads",
            "2",
        ],
    ),
    "slime-rl train_async": ("train-async", ["--train-num-threads", "1", "--sglang-num-threads", "1"]),
    # the same without the engine lending its idle core and without one forward per prompt: what they bring
    "slime-rl train_async, nothing lent or shared": (
        "train-async",
        ["--train-num-threads", "1", "--sglang-num-threads", "1", "--no-lend-idle-cores", "--no-share-prompt-forward"],
    ),
    # train_async with slime's truncated importance sampling (--use-tis, clip 2): each token weighted by
    # min(current / generating policy, 2), which corrects the one-version lag of its samples
    "slime-rl train_async --use-tis": (
        "train-async",
        ["--train-num-threads", "1", "--sglang-num-threads", "1", "--use-tis"],
    ),
    # without the MKL vendor shim (slime.runtime.mkl_vendor): what it brings, where it applies
    "slime-rl train_async --no-mkl-vendor-shim": (
        "train-async",
        ["--train-num-threads", "1", "--sglang-num-threads", "1", "--no-mkl-vendor-shim"],
    ),
}


def run_slime(name: str, model: Path, data_dir: Path, steps: int, seed: int, run_dir: Path) -> dict:
    from slime.utils.checkpoint_layout import iter_dir

    command, extra = SLIME_MODES[name]
    argv = slime_argv(model, data_dir, steps, seed, run_dir) + extra
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "slime", command, *argv], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"[vs_trl] {name} failed:\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if "perf/step_time" in r]
    timed = step_rows[1:-1] if len(step_rows) > 2 else step_rows
    n = JOB["prompts"] * JOB["samples"]
    return {
        "system": name,
        "step_s": [r["perf/step_time"] for r in timed],
        "gen_s": [r.get("perf/rollout_time", float("nan")) for r in timed],
        "gen_tokens": [r.get("rollout/response_len/mean", float("nan")) * n for r in timed],
        "rewards": [r["rollout/raw_reward"] for r in step_rows if "rollout/raw_reward" in r],
        "phases": {
            k: statistics.median([r[k] for r in timed if k in r] or [float("nan")])
            for k in ("perf/rollout_time", "perf/train_time", "perf/update_weights_time")
        },
        "wall_s": wall,
        "model": Path(iter_dir(run_dir / "checkpoints", steps - 1)),
        "argv": [command, *argv],
    }


def run_trl(model: Path, data_dir: Path, steps: int, seed: int, out: Path, shim: bool = False) -> dict:
    """`shim`: TRL's process gets the MKL vendor shim slime-rl preloads into its own (`trl-mkl`)."""
    cfg = {
        "model": str(model),
        "train": str(data_dir / "train.jsonl"),
        "out": str(out),
        "steps": steps,
        "seed": seed,
        "threads": JOB["threads"],
        "prompts": JOB["prompts"],
        "samples": JOB["samples"],
        "new_tokens": JOB["new_tokens"],
        "lr": JOB["lr"],
        "lora_rank": JOB["lora_rank"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    from slime.runtime.mkl_vendor import preload_env

    run_trl_worker(["train", str(out / "config.json")], preload=preload_env() if shim else None)
    wall = time.perf_counter() - t0  # the whole process, as for slime-rl
    r = json.loads((out / "result.json").read_text())
    return {
        "system": f"TRL {r['versions']['trl']}" + (TRL_MKL_SUFFIX if shim else ""),
        "step_s": r["step_s"][1:],
        "gen_s": r["gen_s"][1:],
        "gen_tokens": r["gen_tokens"][1:],
        "rewards": r["rewards"],
        "phases": {},
        "wall_s": wall,
        "model": out / "model",
        "config": {**r["config"], "trained_params": r.get("trained_params")},
        "versions": r["versions"],
    }


def heldout_accuracy(model_dir: Path, eval_file: Path, new_tokens: int) -> float:
    """Greedy accuracy on the held-out problems: HF generate, slime's `math` grader (same for every system)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.rollout.rm_hub.math_utils import grade_math

    rows = [json.loads(line) for line in eval_file.read_text().splitlines() if line.strip()]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = [
        tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False)
        for r in rows
    ]
    enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(grade_math(a, str(r["label"])) for a, r in zip(answers, rows, strict=True)) / len(rows)


def summarise(runs: list[dict], acc_before: float) -> list[dict]:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["system"], []).append(r)
    out = []
    for name, rs in by.items():
        steps = [s for r in rs for s in r["step_s"]]
        gen_s = sum(s for r in rs for s in r["gen_s"])
        gen_tok = sum(t for r in rs for t in r["gen_tokens"])
        tail = [statistics.mean(r["rewards"][-max(1, len(r["rewards"]) // 5) :]) for r in rs if r["rewards"]]
        out.append(
            {
                "system": name,
                "median_s": statistics.median(steps),
                "tok_s": gen_tok / gen_s if gen_s else 0.0,
                "acc_before": acc_before,
                "acc_after": [r["acc_after"] for r in rs],
                "reward_tail": statistics.mean(tail) if tail else float("nan"),
                "phases": {k: statistics.median([r["phases"][k] for r in rs]) for k in rs[0]["phases"]},
                "wall_s": statistics.mean(r["wall_s"] for r in rs),
            }
        )
    return out


def print_table(
    summary: list[dict], steps: int, rounds: int, sft_steps: int, model: str = "tiny", params: int = 0
) -> None:
    trl = next((s for s in summary if s["system"].startswith("TRL") and not s["system"].endswith(TRL_MKL_SUFFIX)), None)
    trl_mkl = next((s for s in summary if s["system"].endswith(TRL_MKL_SUFFIX)), None)
    what = (
        f"default job's model after {sft_steps} SFT steps"
        if model == "tiny"
        else f"~{model[:-1]}M Qwen2-style model as initialised (no SFT)"
    )
    rank = JOB["lora_rank"]
    lora_note = f"; LoRA rank {rank}, alpha {2 * rank}, all linear layers of the decoder" if rank else ""
    from bench.hardware import header

    print(f"\n{header()}")
    print(
        f"vs TRL: {what} ({params / 1e6:.2f}M parameters), {JOB['prompts']} prompts x "
        f"{JOB['samples']} samples, {JOB['new_tokens']} new tokens, lr {JOB['lr']:g}, no KL, per-sample loss, "
        f"{steps} steps x {rounds} round(s), alternating; {os.cpu_count()} cores"
        f"{lora_note}"
        f", fp32, {JOB['threads']} threads each"
    )
    from slime.runtime.mkl_vendor import cpu_info, not_applicable

    why = not_applicable()
    print(
        f"CPU vendor {cpu_info().get('vendor_id', '?')}: slime-rl's MKL vendor shim "
        + (
            "applies (slime-rl's processes get it; TRL's only in the row marked so)"
            if why is None
            else f"does not apply ({why})"
        )
    )
    extra = " | vs TRL + MKL vendor shim" if trl_mkl else ""
    print(
        "| system | median s/step | rollout tok/s | held-out acc before | after (per round) | train reward, "
        f"last fifth | vs TRL (s/step ratio){extra} | rollout / train / weight sync (median s) | run wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if trl_mkl else ""))
    for s in summary:
        ratio = f"{trl['median_s'] / s['median_s']:.2f}x" if trl else "-"
        if trl_mkl:
            ratio += f" | {trl_mkl['median_s'] / s['median_s']:.2f}x"
        ph = s["phases"]
        phases = (
            " / ".join(f"{ph[k]:.3f}" for k in ("perf/rollout_time", "perf/train_time", "perf/update_weights_time"))
            if ph
            else "-"
        )
        after = ", ".join(f"{a:.3f}" for a in s["acc_after"])
        print(
            f"| {s['system']} | {s['median_s']:.3f} | {s['tok_s']:.0f} | {s['acc_before']:.3f} | {after} "
            f"| {s['reward_tail']:.3f} | {ratio} | {phases} | {s['wall_s']:.0f} |"
        )
    print(
        "ratio > 1: faster than TRL per step. Held-out accuracy: 200 problems, greedy; one evaluation's binomial "
        "noise is about +-3.5 points at 50%."
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":  # inside .venv-trl
        if sys.argv[2] == "train":
            _trl_train(json.loads(Path(sys.argv[3]).read_text()))
        else:
            _trl_check(sys.argv[3], sys.argv[4])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 6 steps, 1 round, 20 SFT steps")
    p.add_argument("--steps", type=int, default=200, help="training steps (rollouts) per run")
    p.add_argument("--rounds", type=int, default=2, help="runs of each system, alternating")
    p.add_argument("--sft-steps", type=int, default=140, help="SFT steps of the starting model (default job: 140)")
    p.add_argument("--seed", type=int, default=1, help="seed of round 0 (round r: seed + r, the same for all)")
    p.add_argument(
        "--systems",
        nargs="+",
        default=["trl", "trl-mkl", "sync", "async", "async-tis"],
        choices=["trl", "trl-mkl", "sync", "async", "async-plain", "async-tis", "async-no-shim"],
        help="trl-mkl: TRL with slime-rl's MKL vendor shim preloaded (left out where the shim does not "
        "apply); async-plain: train_async with --no-lend-idle-cores --no-share-prompt-forward; "
        "async-tis: train_async with --use-tis; async-no-shim: train_async with --no-mkl-vendor-shim",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=REPO / "runs" / "vs_trl",
        help="where the SFT model, data and runs go (the SFT model is reused)",
    )
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="tiny",
        help="tiny: the default job's model after SFT, 32 prompts x 8, 8 new tokens; 25m / 150m / 190m: a ~25M / "
        "~150M / ~190M Qwen2-style model as initialised, 8 prompts x 8, 32 new tokens",
    )
    p.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="R > 0: every system trains a LoRA adapter of rank R (alpha 2R, every linear layer of the decoder; "
        "TRL: peft's LoraConfig in GRPOTrainer; slime-rl: --enable-lora) instead of every weight",
    )
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the job's, 3e-4)")
    p.add_argument("--check", action="store_true", help="only the loss/advantage consistency check")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--no-install", action="store_true", help="do not create .venv-trl; say how instead")
    p.add_argument("--install-only", action="store_true", help="create .venv-trl (if needed) and exit")
    p.add_argument("--trl-venv", type=Path, default=TRL_VENV, help="TRL's virtual environment (default: .venv-trl)")
    a = p.parse_args()
    use_trl_venv(a.trl_venv)
    for name, value in (("--steps", a.steps), ("--rounds", a.rounds), ("--sft-steps", a.sft_steps)):
        if value < 1:
            raise SystemExit(f"[vs_trl] {name} must be >= 1, got {value}")
    sys.path.insert(0, str(REPO))
    if a.install_only:
        print(json.dumps(require_trl(install=True)))
        return
    if a.check:
        rows = consistency_check(a.work_dir / "check", install=not a.no_install)
        print_check(rows)
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1))
        raise SystemExit(0 if all(r["ok"] for r in rows) else 1)
    if a.quick:
        a.steps, a.rounds, a.sft_steps = 6, 1, 20
    JOB.update(MODELS[a.model], lora_rank=a.lora_rank, **({"lr": a.lr} if a.lr is not None else {}))
    if "trl-mkl" in a.systems:
        from slime.runtime.mkl_vendor import not_applicable

        if (why := not_applicable()) is not None:  # TRL + shim would be TRL again
            print(f"[vs_trl] trl-mkl left out: the MKL vendor shim does not apply here ({why})", flush=True)
            a.systems = [s for s in a.systems if s != "trl-mkl"]
    if {"trl", "trl-mkl"} & set(a.systems):
        require_trl(install=not a.no_install)
    import torch

    torch.set_num_threads(JOB["threads"])
    work = a.work_dir
    work.mkdir(parents=True, exist_ok=True)
    model, data_dir = build_assets(work, a.sft_steps, a.seed, a.model)
    acc_before = heldout_accuracy(model, data_dir / "eval.jsonl", JOB["new_tokens"])
    print(f"[vs_trl] starting model {model}: held-out accuracy {acc_before:.3f}", flush=True)
    order = {
        "trl": None,
        "sync": "slime-rl sync",
        "async": "slime-rl train_async",
        "async-plain": "slime-rl train_async, nothing lent or shared",
        "async-tis": "slime-rl train_async --use-tis",
        "async-no-shim": "slime-rl train_async --no-mkl-vendor-shim",
    }
    runs, trl_config_used, slime_argvs = [], None, {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for rnd in range(a.rounds):
        seed = a.seed + rnd
        systems = a.systems[rnd % len(a.systems) :] + a.systems[: rnd % len(a.systems)]  # rotate the order
        for key in systems:
            out = work / f"{stamp}-r{rnd}-{key}"
            print(f"[vs_trl] round {rnd} (seed {seed}): {key} ...", flush=True)
            if key in ("trl", "trl-mkl"):
                r = run_trl(model, data_dir, a.steps, seed, out, shim=key == "trl-mkl")
                trl_config_used = r["config"]
            else:
                r = run_slime(order[key], model, data_dir, a.steps, seed, out)
                slime_argvs[r["system"]] = r["argv"]
            r["acc_after"] = heldout_accuracy(r["model"], data_dir / "eval.jsonl", JOB["new_tokens"])
            print(
                f"[vs_trl]   median {statistics.median(r['step_s']):.3f} s/step, held-out after "
                f"{r['acc_after']:.3f}, wall {r['wall_s']:.0f} s",
                flush=True,
            )
            runs.append(r)
    summary = summarise(runs, acc_before)
    from transformers import AutoConfig, AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).parameters())
    print_table(summary, a.steps, a.rounds, a.sft_steps, a.model, params)
    print("\nconfigurations")
    if trl_config_used:
        print("TRL GRPOConfig:", json.dumps(trl_config_used, sort_keys=True))
        print("TRL reward: 1.0 if the last \\boxed{} equals the label, else 0.0 (slime-rl: --rm-type math)")
    for name, argv in slime_argvs.items():
        print(f"{name}: slime {' '.join(argv)}")
    if a.json:
        a.json.write_text(
            json.dumps(
                {"summary": summary, "trl_config": trl_config_used, "slime_argv": slime_argvs}, indent=1, default=str
            )
        )


if __name__ == "__main__":
    main()
