"""Where the trainer's weights come from, resolved as slime resolves `--load` and `--ref-load`,
before anything is launched.

* `--load DIR` that holds no checkpoint yet is slime's `--load X --save X` pattern on its first
  run: training starts from rollout 0 with the initial weights (`--ref-load`), said in one line.
* `--load DIR` with a checkpoint: it must be complete (its manifest's files all there, at their
  sizes) and hold every part this run reads (`checkpoint_layout.check_complete`), else it stops,
  naming the missing or damaged part.
* `--ref-load` pointing at a Megatron-LM `torch_dist` checkpoint (slime converts the Hugging Face
  model into one): the fsdp backend reads Hugging Face weights only, so when the checkpoint's
  tensor shapes are those of `--hf-checkpoint`'s config, `--hf-checkpoint`'s weights are used,
  said in one line; otherwise it stops, explaining what to pass instead.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from slime.data.data_source import RolloutDataSource
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import (
    ROLLOUT_STATE_FILE,
    TRAINER_STATE_FILE,
    check_complete,
    has_checkpoint,
    latest_dir,
    megatron_iteration_dir,
)
from slime.utils.misc import load_function

# Megatron-LM's name of the word embeddings in a GPT checkpoint: [padded vocab, hidden]
EMBEDDING_KEY = "embedding.word_embeddings.weight"
# a per-layer tensor stored with the layers stacked first: [num_layers, ...]
LAYER_KEY = "decoder.layers.self_attention.linear_proj.weight"


def resolve_checkpoints(args: Namespace, config: dict) -> list[str]:
    """Apply slime's rules to `args.load` / `args.ref_load`; returns the notes to print."""
    notes = []
    megatron_run = megatron_iteration_dir(args.load) if args.load else None
    if megatron_run is not None and not (megatron_run / TRAINER_STATE_FILE).exists():
        raise SlimeError(
            f"--load {args.load} holds a Megatron-LM torch_dist checkpoint ({megatron_run.name}), which "
            f"--train-backend {args.train_backend} cannot resume (it has no {TRAINER_STATE_FILE}: not written by "
            f"slime-rl); point --load at a checkpoint of a slime-rl run, or at an "
            f"empty directory to start from --ref-load"
        )
    if args.load and not has_checkpoint(args.load):
        if (Path(args.load) / "config.json").exists():
            raise SlimeError(
                f"--load {args.load} is a Hugging Face model directory, not a checkpoint of a run; "
                f"pass it as --hf-checkpoint (and --ref-load) to start from its weights"
            )
        notes.append(
            f"--load {args.load} holds no checkpoint yet: starting at rollout 0 from --ref-load "
            f"{args.ref_load} (--save writes there as the run goes)"
        )
        # argument resolution, as slime's own (slime/utils/arguments.py rewrites --load the same way)
        args.load = None
    if args.load:  # a half-written or foreign checkpoint stops here, naming what is wrong
        check_complete(latest_dir(args.load), f"--load {args.load}", needs=_resume_needs(args))
    megatron_dir = None if (Path(args.ref_load) / "config.json").exists() else megatron_iteration_dir(args.ref_load)
    if megatron_dir is not None:
        _check_same_model(args, megatron_dir, config)
        notes.append(
            f"--ref-load {args.ref_load} is a Megatron-LM torch_dist checkpoint, which the fsdp backend "
            f"does not read; its shapes match --hf-checkpoint, whose Hugging Face weights are used"
        )
        args.ref_load = args.hf_checkpoint  # argument resolution, as for --load above
    return notes


def _resume_needs(args: Namespace) -> tuple[str, ...]:
    """The parts of the --load checkpoint this run reads: the trainer's always; the data position and
    Data Buffer when the data resumes from that same checkpoint (the default data source, with the
    global dataset, --start-rollout-id unset)."""
    needs = ("config.json", "*.safetensors", TRAINER_STATE_FILE)
    if not args.rollout_global_dataset or args.start_rollout_id is not None:
        return needs
    try:
        source = load_function(args.data_source_path, arg_name="--data-source-path")
    except SlimeError:  # reported by the hook checks that follow
        return needs
    if isinstance(source, type) and issubclass(source, RolloutDataSource):
        return (*needs, ROLLOUT_STATE_FILE)
    return needs


def _check_same_model(args: Namespace, megatron_dir: Path, config: dict) -> None:
    # Imported here: torch.distributed.checkpoint costs ~1 s at every run's start, and only a
    # Megatron-format --load reaches this check.
    from torch.distributed.checkpoint import FileSystemReader

    config = config.get("text_config") or config
    try:
        shapes = {
            k: list(v.size)
            for k, v in FileSystemReader(str(megatron_dir)).read_metadata().state_dict_metadata.items()
            if hasattr(v, "size")
        }
    except Exception as e:
        raise SlimeError(
            f"--ref-load {args.ref_load}: cannot read the torch_dist metadata of {megatron_dir} "
            f"({type(e).__name__}: {e})"
        ) from e
    explain = (
        f"--ref-load {args.ref_load} is a Megatron-LM torch_dist checkpoint, which the fsdp backend does not "
        f"read, and it is not the model of --hf-checkpoint {args.hf_checkpoint}"
    )
    fix = "; pass the Hugging Face directory of the reference model as --ref-load"
    if EMBEDDING_KEY not in shapes:
        raise SlimeError(f"{explain}: it has no {EMBEDDING_KEY} to compare{fix}")
    vocab, hidden = shapes[EMBEDDING_KEY]
    if hidden != config.get("hidden_size") or not 0 <= vocab - config.get("vocab_size", vocab) < 4096:
        raise SlimeError(
            f"{explain}: its embeddings are {vocab} x {hidden}, the config's vocab_size x hidden_size "
            f"{config.get('vocab_size')} x {config.get('hidden_size')}{fix}"
        )
    layers = shapes.get(LAYER_KEY)
    if layers is not None and len(layers) == 3 and layers[0] != config.get("num_hidden_layers"):
        raise SlimeError(f"{explain}: it has {layers[0]} layers, the config {config.get('num_hidden_layers')}{fix}")
