"""`RolloutDataSource`: hands out prompt groups to the rollout, epoch after epoch.

Each call `get_samples(num_groups)` returns the next `num_groups` prompts, each repeated
`n_samples_per_prompt` times as independent `Sample` copies. `group_index` is a global running
prompt counter and `index` a global running sample counter. At the end of the data a new epoch
starts; with `rollout_shuffle` every epoch has its own order, a deterministic function of
`rollout_seed` and the epoch number. `state_dict()` / `load_state_dict()` (and `save` / `load`
as JSON) let a resumed run continue exactly where it stopped.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from slime.data.dataset import PromptSamples, load_prompt_samples
from slime.errors import SlimeError
from slime.utils.types import Sample

_STATE_VERSION = 1


def load_tokenizer(path: str | None, *, arg_name: str = "--hf-checkpoint"):
    """`AutoTokenizer.from_pretrained(path)` with a `SlimeError` naming the argument on failure."""
    if not path:
        raise SlimeError(f"{arg_name} is not set, but a tokenizer is needed")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    except Exception as e:
        raise SlimeError(f"cannot load a tokenizer from {arg_name} {str(path)!r}: {type(e).__name__}: {e}") from e


class RolloutDataSource:
    """The prompt dataset of a run and the position reached in it."""

    def __init__(self, args: Any, *, tokenizer: Any = None):
        self.args = args
        self.n_samples_per_prompt = int(getattr(args, "n_samples_per_prompt", 1) or 1)
        if self.n_samples_per_prompt < 1:
            raise SlimeError(f"--n-samples-per-prompt must be >= 1, got {self.n_samples_per_prompt}")
        self.shuffle = bool(getattr(args, "rollout_shuffle", False))
        self.seed = int(getattr(args, "rollout_seed", 42) or 0)
        self._tokenizer = tokenizer

        self.epoch = 0
        self.offset = 0  # prompts of the current epoch already handed out
        self.group_counter = 0  # next group_index
        self.sample_counter = 0  # next index

        prompt_data = getattr(args, "prompt_data", None)
        self.dataset: PromptSamples | None = None
        if prompt_data:
            apply_template = bool(getattr(args, "apply_chat_template", False))
            max_prompt_len = getattr(args, "rollout_max_prompt_len", None)
            tokenizer = self.tokenizer if (apply_template or max_prompt_len) else None
            input_key = getattr(args, "input_key", None) or "input"
            self.dataset = load_prompt_samples(
                prompt_data,
                input_key=input_key,
                label_key=getattr(args, "label_key", None),
                metadata_key=getattr(args, "metadata_key", None),
                tokenizer=tokenizer,
                apply_chat_template=apply_template,
                apply_chat_template_kwargs=getattr(args, "apply_chat_template_kwargs", None),
                max_prompt_len=max_prompt_len,
            )
            if not self.dataset:
                dropped = f" ({self.dataset.num_dropped} dropped as longer than --rollout-max-prompt-len)" if self.dataset.num_dropped else ""
                raise SlimeError(f"--prompt-data {prompt_data!r} holds no prompts{dropped}")
        self._order = self._epoch_order(self.epoch)

    # -- helpers -----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(getattr(self.args, "hf_checkpoint", None))
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
        if self.dataset is None:
            raise SlimeError("no prompt data: set --prompt-data (or use a custom data source)")
        if num_groups < 0:
            raise SlimeError(f"get_samples: num_groups must be >= 0, got {num_groups}")
        groups: list[list[Sample]] = []
        for _ in range(num_groups):
            if self.offset >= len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._epoch_order(self.epoch)
            prompt_sample = self.dataset[self._order[self.offset]]
            self.offset += 1
            group = []
            for _ in range(self.n_samples_per_prompt):
                s = copy.deepcopy(prompt_sample)
                s.group_index = self.group_counter
                s.index = self.sample_counter
                self.sample_counter += 1
                group.append(s)
            self.group_counter += 1
            groups.append(group)
        return groups

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "offset": self.offset,
            "group_counter": self.group_counter,
            "sample_counter": self.sample_counter,
            "num_prompts": len(self),
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        self._order = self._epoch_order(self.epoch)

    def save(self, path: str | Path) -> Path:
        """Write `state_dict()` as JSON (atomically: a crash never leaves half a file)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.state_dict(), indent=2) + "\n")
        tmp.replace(p)
        return p

    def load(self, path: str | Path) -> None:
        p = Path(path)
        try:
            state = json.loads(p.read_text())
        except FileNotFoundError:
            raise SlimeError(f"data source state file {str(p)!r} does not exist") from None
        except (OSError, json.JSONDecodeError) as e:
            raise SlimeError(f"cannot read data source state {str(p)!r}: {e}") from e
        if not isinstance(state, dict):
            raise SlimeError(f"data source state {str(p)!r} is not a JSON object")
        self.load_state_dict(state)
