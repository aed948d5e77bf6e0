"""The Data Buffer: prompt groups for the rollout, epoch after epoch, plus groups kept for later.

`RolloutDataSourceWithBuffer` (the default `--data-source-path`) is what a rollout function
receives as `data_source`: `get_samples(n)` first takes groups from its buffer (partial or
over-sampled groups a rollout put back with `add_samples`, chosen by `--buffer-filter-path`,
oldest first by default), then new prompts from `RolloutDataSource`.

Each call `get_samples(num_groups)` returns the next `num_groups` prompts, each repeated
`n_samples_per_prompt` times as independent `Sample` copies. `group_index` is a global running
prompt counter and `index` a global running sample counter. At the end of the data a new epoch
starts; with `rollout_shuffle` every epoch has its own order, a deterministic function of
`rollout_seed` and the epoch number. `state_dict()` / `load_state_dict()` (and `save` / `load`
as JSON, buffer included) let a resumed run continue exactly where it stopped. `save(rollout_id)`
and `load(rollout_id)` are slime's DataSource contract: the state lives in the checkpoint
directory of that rollout (`<save>/iter_XXXXXXX/rollout_state.json`); `resume` says which one a
run starts from (slime's rule, `--start-rollout-id`).

With `--disable-rollout-global-dataset` (slime's) `--prompt-data` is not loaded: the rollout
function brings its own prompts, `get_samples(n)` hands out the Data Buffer's groups and then
groups of empty `Sample`s (numbered as usual), and `save` / `load` do nothing, as slime's.
"""

from __future__ import annotations

import abc
import copy
import enum
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from slime.data.dataset import PromptSamples, load_prompt_samples
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import ROLLOUT_STATE_FILE, iter_dir, latest_dir, rollout_id_of
from slime.utils.misc import load_function
from slime.utils.types import Sample

_STATE_VERSION = 2
logger = logging.getLogger(__name__)


def load_tokenizer(path: str | None, *, arg_name: str = "--hf-checkpoint"):
    """`AutoTokenizer.from_pretrained(path)` with a `SlimeError` naming the argument on failure."""
    if not path:
        raise SlimeError(f"{arg_name} is not set, but a tokenizer is needed")
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    except Exception as e:
        raise SlimeError(f"cannot load a tokenizer from {arg_name} {str(path)!r}: {type(e).__name__}: {e}") from e


class DataSource(abc.ABC):
    """slime's data source contract: what `--data-source-path` names and a rollout function receives."""

    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next `num_samples` groups of samples."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Take groups back, for a later rollout."""

    @abc.abstractmethod
    def save(self, rollout_id):
        """Write the state into the checkpoint of `rollout_id`."""

    @abc.abstractmethod
    def load(self, rollout_id=None):
        """Restore the state saved with `rollout_id` (None: the latest under --load)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Prompts handed out per epoch."""


_IMMUTABLE = (str, int, float, bool, bytes, type(None), enum.Enum)


def independent_copy(sample: Sample) -> Sample:
    """A copy sharing nothing mutable with `sample` (what `copy.deepcopy` gives), made field by field:
    immutable values are shared, empty containers are new ones, only the rest is deep-copied. A
    rollout makes one per sample; a generic deepcopy of each was a sixth of the rollout's Python time."""
    new = copy.copy(sample)
    for name, value in vars(sample).items():
        if isinstance(value, _IMMUTABLE):
            continue
        if type(value) in (list, dict) and not value:
            setattr(new, name, type(value)())
        else:
            setattr(new, name, copy.deepcopy(value))
    return new


class RolloutDataSource(DataSource):
    """The prompt dataset of a run and the position reached in it (read-only: no buffer)."""

    def __init__(self, args: Any, *, tokenizer: Any = None):
        self.args = args
        self.n_samples_per_prompt = args.n_samples_per_prompt
        self.shuffle = args.rollout_shuffle
        self.seed = args.rollout_seed
        self._tokenizer = tokenizer
        # A rollout function may fetch from a background thread (fully async) while the manager
        # saves a checkpoint: every read or change of the position holds this lock.
        self.lock = threading.RLock()

        self.epoch = 0
        self.offset = 0  # prompts of the current epoch already handed out
        self.group_counter = 0  # next group_index
        self.sample_counter = 0  # next index
        # slime's free-form dict a rollout function extends (`update_metadata`), saved with the state
        self.metadata: dict[str, Any] = {}

        prompt_data = args.prompt_data
        self.dataset: PromptSamples | None = None
        if prompt_data and args.rollout_global_dataset:
            tokenizer = self.tokenizer if (args.apply_chat_template or args.rollout_max_prompt_len) else None
            self.dataset = load_prompt_samples(
                prompt_data,
                input_key=args.input_key,
                label_key=args.label_key,
                metadata_key=args.metadata_key,
                tool_key=args.tool_key,
                tokenizer=tokenizer,
                apply_chat_template=args.apply_chat_template,
                apply_chat_template_kwargs=args.apply_chat_template_kwargs,
                max_prompt_len=args.rollout_max_prompt_len,
            )
            if not self.dataset:
                dropped = (
                    f" ({self.dataset.num_dropped} dropped as longer than --rollout-max-prompt-len)"
                    if self.dataset.num_dropped
                    else ""
                )
                raise SlimeError(f"--prompt-data {prompt_data!r} holds no prompts{dropped}")
        self._order = self._epoch_order(self.epoch)

    # -- helpers -----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.args.hf_checkpoint)
        return self._tokenizer

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else 0

    @property
    def num_dropped(self) -> int:
        """Prompts left out at load time for being longer than `rollout_max_prompt_len`."""
        return self.dataset.num_dropped if self.dataset is not None else 0

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    # -- the API the rollout uses ------------------------------------------------------------

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` prompts, each as a group of `n_samples_per_prompt` Samples."""
        with self.lock:
            return self._new_groups(num_groups)

    def _new_groups(self, num_groups: int) -> list[list[Sample]]:
        if self.dataset is None and self.args.rollout_global_dataset:
            raise SlimeError(
                "no prompt data: set --prompt-data (or --disable-rollout-global-dataset when the "
                "rollout function brings its own prompts, or use a custom data source)"
            )
        if num_groups < 0:
            raise SlimeError(f"get_samples: num_groups must be >= 0, got {num_groups}")
        groups: list[list[Sample]] = []
        for _ in range(num_groups):
            groups.append(self._group(self._next_prompt()))
        return groups

    def _next_prompt(self) -> Sample:
        """The next prompt of the epoch order; an empty Sample without the global dataset (slime's)."""
        if self.dataset is None:
            return Sample()
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
        prompt_sample = self.dataset[self._order[self.offset]]
        self.offset += 1
        return prompt_sample

    def _group(self, prompt_sample: Sample) -> list[Sample]:
        """`n_samples_per_prompt` independent copies, numbered by the running counters."""
        group = []
        for _ in range(self.n_samples_per_prompt):
            s = independent_copy(prompt_sample)
            s.group_index = self.group_counter
            s.index = self.sample_counter
            self.sample_counter += 1
            group.append(s)
        self.group_counter += 1
        return group

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise SlimeError(
            f"{type(self).__name__} is a read-only data source and cannot take groups back "
            f"(--partial-rollout needs one with a buffer, e.g. RolloutDataSourceWithBuffer)"
        )

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "offset": self.offset,
            "group_counter": self.group_counter,
            "sample_counter": self.sample_counter,
            "num_prompts": len(self),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "metadata": copy.deepcopy(self.metadata),  # a copy: the saved state must not follow the live dict
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            self._load_state(state)

    def _load_state(self, state: dict[str, Any]) -> None:
        missing = [k for k in ("epoch", "offset", "group_counter", "sample_counter") if k not in state]
        if missing:
            raise SlimeError(f"data source state is missing {missing}")
        n = state.get("num_prompts")
        if n is not None and n != len(self):
            raise SlimeError(
                f"data source state was saved for {n} prompts but --prompt-data now holds {len(self)}: "
                "resume with the same prompt data"
            )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.group_counter = int(state["group_counter"])
        self.sample_counter = int(state["sample_counter"])
        self.metadata = copy.deepcopy(state.get("metadata") or {})  # a state saved before it existed: {}
        self._order = self._epoch_order(self.epoch)

    def _state_path(self, where: int | str | Path | None, directory_arg: str) -> Path:
        """A rollout id -> that checkpoint's state file (under --save or --load); a path -> itself."""
        if isinstance(where, (str, Path)):
            return Path(where)
        root = getattr(self.args, directory_arg)  # "save" or "load"
        if not root:
            raise SlimeError(f"--{directory_arg} is not set: nowhere to keep the data source state")
        directory = latest_dir(root) if where is None else iter_dir(root, int(where))
        return directory / ROLLOUT_STATE_FILE

    def save(self, rollout_id_or_path: int | str | Path) -> Path | None:
        """Write `state_dict()` as JSON (atomically: a crash never leaves half a file). Nothing
        without the global dataset (slime's)."""
        if not self.args.rollout_global_dataset:
            return None
        p = self._state_path(rollout_id_or_path, "save")
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.state_dict(), indent=2, default=str) + "\n")
        tmp.replace(p)
        return p

    def load(self, rollout_id_or_path: int | str | Path | None = None) -> None:
        """Restore from a state file; a rollout id (or None: the latest) reads it under --load.
        Nothing without the global dataset (slime's)."""
        if not self.args.rollout_global_dataset:
            return
        p = self._state_path(rollout_id_or_path, "load")
        try:
            state = json.loads(p.read_text())
        except FileNotFoundError:
            raise SlimeError(f"data source state file {str(p)!r} does not exist") from None
        except (OSError, json.JSONDecodeError) as e:
            raise SlimeError(f"cannot read data source state {str(p)!r}: {e}") from e
        if not isinstance(state, dict):
            raise SlimeError(f"data source state {str(p)!r} is not a JSON object")
        self.load_state_dict(state)


def resume_rollout_id(args: Any) -> int | None:
    """The rollout whose saved data state a run resumes from, by slime's rule (train.py /
    placement_group.py: `data_source.load(start_rollout_id - 1)` with the global dataset only):
    `--start-rollout-id N` -> N - 1; unset, the --load checkpoint's rollout (the trainer resumes
    at the one after it). None: no --load, no global dataset, N = 0, or (unset) a --load that is
    one checkpoint directory not named iter_XXXXXXX (`resume` then reads that directory)."""
    if not args.rollout_global_dataset or not args.load:
        return None
    if args.start_rollout_id is not None:
        return args.start_rollout_id - 1 if args.start_rollout_id > 0 else None
    return rollout_id_of(latest_dir(args.load))


def resume(data_source: DataSource, args: Any) -> Path | int | None:
    """Restore the data position (and Data Buffer) a run starts from (`resume_rollout_id`); returns
    what was loaded (the state file, or the rollout id given to a custom source's `load`), None
    when nothing. No checkpoint of that rollout leaves the position fresh, as under slime; a checkpoint
    directory without the data state stops the run (slime would resume its weights at data step 0)."""
    if not args.rollout_global_dataset or not args.load:
        return None
    if args.start_rollout_id is None:
        directory = latest_dir(args.load)  # also a --load that is one iteration directory itself
        rollout_id = rollout_id_of(directory)
    else:
        rollout_id = resume_rollout_id(args)
        directory = iter_dir(args.load, rollout_id) if rollout_id is not None else None
    if not isinstance(data_source, RolloutDataSource):  # a --data-source-path class: slime's load(rollout_id)
        if directory is None:  # --start-rollout-id 0: from the beginning
            return None
        data_source.load(rollout_id)  # None: "the latest under --load" (the contract's default)
        return rollout_id
    if directory is None or not directory.is_dir():  # no checkpoint of that rollout: as slime, from the start
        logger.info(
            "no data source state to resume%s; starting the data from its beginning",
            f" in {directory}" if directory is not None else "",
        )
        return None
    if not (directory / ROLLOUT_STATE_FILE).exists():  # a checkpoint without it would resume at data step 0
        raise SlimeError(
            f"--load {args.load}: the checkpoint {directory} has no {ROLLOUT_STATE_FILE} (the data "
            f"position and Data Buffer): it is incomplete, or was saved without the global dataset; "
            f"resume from a complete checkpoint, or pass --start-rollout-id 0 to start the data over"
        )
    data_source.load(directory / ROLLOUT_STATE_FILE)
    return directory / ROLLOUT_STATE_FILE


def pop_first(args: Any, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """The default `--buffer-filter-path`: the oldest `num_samples` groups, removed from the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """`RolloutDataSource` plus the Data Buffer: groups put back by a rollout are handed out first.

    A rollout puts back groups it could not use this time: with `--partial-rollout`, groups whose
    generation it aborted (their samples keep the partial response and resume from it) and
    finished groups beyond what it needed. The buffer is part of the saved state.
    """

    def __init__(self, args: Any, *, tokenizer: Any = None):
        super().__init__(args, tokenizer=tokenizer)
        self.buffer: list[list[Sample]] = []
        path = args.buffer_filter_path
        self.buffer_filter = load_function(path, arg_name="--buffer-filter-path") if path else pop_first
        self.rollout_id: int | None = None  # set by the rollout manager; passed to the buffer filter

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        with self.lock:
            groups = self._from_buffer(num_groups) if self.buffer else []
            if len(groups) < num_groups:
                groups += self._new_groups(num_groups - len(groups))
            return groups

    def _from_buffer(self, num_groups: int) -> list[list[Sample]]:
        before = len(self.buffer)
        taken = self.buffer_filter(self.args, self.rollout_id, self.buffer, num_groups)
        path = self.args.buffer_filter_path or "pop_first"
        if not isinstance(taken, list) or not all(isinstance(g, list) for g in taken):
            raise SlimeError(
                f"--buffer-filter-path {path} must return a list of groups (lists of Sample), "
                f"got {type(taken).__name__}"
            )
        if len(taken) > num_groups:
            raise SlimeError(f"--buffer-filter-path {path} returned {len(taken)} groups; {num_groups} were asked for")
        if len(self.buffer) != before - len(taken):
            raise SlimeError(
                f"--buffer-filter-path {path} must remove the groups it returns from the buffer "
                f"(buffer went from {before} to {len(self.buffer)} groups, {len(taken)} returned)"
            )
        return taken

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Put groups back for a later rollout (each a full group of `n_samples_per_prompt`)."""
        for group in groups:
            if not isinstance(group, list) or len(group) != self.n_samples_per_prompt:
                size = len(group) if isinstance(group, list) else type(group).__name__
                raise SlimeError(
                    f"add_samples: a group must be a list of --n-samples-per-prompt "
                    f"({self.n_samples_per_prompt}) samples, got {size}"
                )
        with self.lock:
            self.buffer.extend(groups)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def update_metadata(self, metadata: dict) -> None:
        """Merge `metadata` into the source's dict (later keys replace earlier ones, as dict.update)."""
        with self.lock:
            self.metadata.update(metadata)

    def get_metadata(self) -> dict:
        """The source's metadata dict itself (slime returns the live dict, not a copy)."""
        return self.metadata

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state["buffer"] = [[s.to_dict() for s in g] for g in self.buffer]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            super().load_state_dict(state)
            self.buffer = [[Sample.from_dict(d) for d in g] for g in state.get("buffer", [])]
