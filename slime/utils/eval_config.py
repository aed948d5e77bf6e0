"""slime's `slime.utils.eval_config`: one evaluation data set and its settings
(`EvalDatasetConfig`, slime's field names), resolved from `--eval-config` (slime's multi-task
YAML) or `--eval-prompt-data`, each field as slime resolves it: the data set's entry, then
`eval.defaults`, then the command line (the eval option, then the rollout one). Read by the
argument parser (slime/arguments/evaluation.py) and by the eval rollout.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from slime.errors import SlimeError

logger = logging.getLogger(__name__)


@dataclass
class EvalDatasetConfig:
    """One eval data set and its settings (slime's `slime.utils.eval_config.EvalDatasetConfig` fields).

    None means "not set": the eval rollout then uses its own default (rm_type: the sample's or
    --rm-type; custom_generate_function_path: --custom-generate-function-path; skip_special_tokens:
    --rollout-skip-special-tokens; no_stop_trim: true).
    """

    name: str
    path: str
    rm_type: str | None = None
    custom_rm_path: str | None = None
    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = None
    metadata_key: str | None = None
    multimodal_keys: dict | None = None
    apply_chat_template: bool | None = None
    apply_chat_template_kwargs: dict | None = None
    n_samples_per_eval_prompt: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_response_len: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_new_tokens: int | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    custom_generate_function_path: str | None = None
    app_service: str | None = None
    eval_task_timeout: int | None = None
    min_eval_samples: int | None = None
    eval_early_stop_remaining: int | None = None
    eval_early_stop_idle_timeout: float | None = None
    message_processor: dict | None = None
    reward_model: dict | None = None
    remote_environment: dict | None = None
    metadata_overrides: dict = field(default_factory=dict)
    # What the file set for this data set (its entry over eval.defaults). The rest follows the
    # args, so it is resolved again at eval time against the args the eval function is given.
    given: dict = field(default_factory=dict, repr=False, compare=False)

    def inject_metadata(self, metadata: Any) -> dict:
        """A sample's metadata with this data set's rm_type and metadata_overrides on top (slime's)."""
        out = dict(metadata) if isinstance(metadata, dict) else {}
        if self.rm_type is not None:
            out["rm_type"] = self.rm_type
        out.update(self.metadata_overrides)
        return out

    @property
    def cache_key(self) -> tuple[Any, ...]:
        """What identifies the prompts loaded for this data set (slime's): name, path and the keys
        a row is read with; two configs with the same key can share one loaded data set."""
        return (self.name, self.path, self.input_key, self.label_key, self.tool_key, self.metadata_key)


# Where a field not set in the file comes from: the first of these args that is set (slime's specs).
ARG_FALLBACKS: dict[str, tuple[str, ...]] = {
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "min_eval_samples": (),
    "stop": ("rollout_stop",),
    "stop_token_ids": ("rollout_stop_token_ids",),
    "min_new_tokens": ("eval_min_new_tokens",),
    "input_key": ("eval_input_key", "input_key"),
    "label_key": ("eval_label_key", "label_key"),
    "tool_key": ("eval_tool_key", "tool_key"),
    "metadata_key": ("metadata_key",),
    "multimodal_keys": ("multimodal_keys",),
    "apply_chat_template": ("apply_chat_template",),
    "apply_chat_template_kwargs": ("apply_chat_template_kwargs",),
    "custom_rm_path": ("eval_custom_rm_path", "custom_rm_path"),
}
# slime's fields its own eval rollout does not read either (server mode, early stop, inline
# sources): accepted so a slime file loads, and named once as not used here.
NOT_USED_FIELDS = (
    "app_service",
    "eval_task_timeout",
    "min_eval_samples",
    "eval_early_stop_remaining",
    "eval_early_stop_idle_timeout",
    "message_processor",
    "reward_model",
    "remote_environment",
)
CONFIG_KEYS = tuple(f.name for f in fields(EvalDatasetConfig) if f.name != "given")
_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "dict": (dict,),
}


def _kind(name: str) -> str:
    """`int | None` -> `int`, from the dataclass's own annotation (one source of truth)."""
    annotation = next(f.type for f in fields(EvalDatasetConfig) if f.name == name)
    return str(annotation).replace(" | None", "")


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):  # YAML's true/false is not a number
        return kind == "bool"
    if kind.startswith("list["):  # one item alone is taken too, as SGLang takes it
        items = value if isinstance(value, list) else [value]
        return all(_is(v, kind[5:-1]) for v in items)
    return isinstance(value, _KINDS[kind])


def _check_type(key: str, value: Any, where: str) -> None:
    kind = _kind(key)
    if value is not None and not _is(value, kind):
        article = "an" if kind == "int" else "a"
        raise SlimeError(f"{where}: {key} must be {article} {kind}, got {type(value).__name__} {value!r}")


def _check_values(values: dict, where: str) -> None:
    """Values the engine or the loop would refuse mid-run: said now, naming the key."""

    def bad(key: str, rule: str) -> None:
        raise SlimeError(f"{where}: {key} must be {rule}, got {values[key]!r}")

    for key in ("n_samples_per_eval_prompt", "max_response_len", "min_eval_samples"):
        if values.get(key) is not None and values[key] < 1:
            bad(key, ">= 1")
    if values.get("min_new_tokens") is not None and values["min_new_tokens"] < 0:
        bad("min_new_tokens", ">= 0")
    if values.get("temperature") is not None and values["temperature"] < 0:
        bad("temperature", ">= 0")
    if values.get("top_p") is not None and not 0 < values["top_p"] <= 1:
        bad("top_p", "in (0, 1]")
    if values.get("top_k") is not None and values["top_k"] != -1 and values["top_k"] < 1:
        bad("top_k", "-1 (off) or >= 1")
    if values.get("multimodal_keys") is not None:
        raise SlimeError(f"{where}: multimodal_keys: multimodal prompts are not supported yet (text models only)")


def _unknown(keys: Any, valid: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(valid)})"
            raise SlimeError(f"{where}: unknown key {key!r}{hint}")


def pick_from_args(args: Any, attrs: tuple[str, ...]) -> Any:
    """slime's `pick_from_args`: the value of the first of `attrs` that `args` has set (not
    None), else None; an attribute `args` lacks counts as not set (hooks pass partial namespaces)."""
    for attr in attrs:
        value = getattr(args, attr, None)
        if value is not None:
            return value
    return None


def resolve_eval_dataset(
    args: argparse.Namespace, name: str, path: str, given: dict | None = None
) -> EvalDatasetConfig:
    """One data set's settings: what the file gave, else the args' fallback (slime's order)."""
    given = dict(given or {})
    values = {key: given[key] if key in given else pick_from_args(args, attrs) for key, attrs in ARG_FALLBACKS.items()}
    values.update({k: v for k, v in given.items() if k not in ARG_FALLBACKS})
    values["metadata_overrides"] = dict(values.get("metadata_overrides") or {})
    return EvalDatasetConfig(name=name, path=path, **values, given=given)


def eval_dataset_configs(args: argparse.Namespace) -> list[EvalDatasetConfig]:
    """The eval data sets as `args` names them now (`eval_prompt_data`: NAME PATH pairs), each
    with what the file gave it (`args.eval_datasets`) and the rest from these args: an eval
    function that changes a copy of the args (say its chat template) is heard."""
    pairs = list(args.eval_prompt_data or [])
    from_file = {c.name: c for c in getattr(args, "eval_datasets", None) or []}
    out = []
    for name, path in zip(pairs[0::2], pairs[1::2], strict=True):
        known = from_file.get(name)
        out.append(resolve_eval_dataset(args, name, path, known.given if known and known.path == path else None))
    return out


def _read_yaml(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise SlimeError(f"--eval-config {path}: no such file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        raise SlimeError(f"--eval-config {path}:{line} not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SlimeError(f"--eval-config {path}: cannot read it ({e})") from None


def _dataset_entries(datasets: Any, where: str) -> list[dict]:
    """`datasets:` as a list of entries with `name`, or a mapping keyed by name (slime takes both)."""
    if isinstance(datasets, dict):
        entries = []
        for name, entry in datasets.items():
            if entry is not None and not isinstance(entry, dict):
                raise SlimeError(f"{where}.datasets.{name}: expected a mapping of settings, got {type(entry).__name__}")
            entries.append({"name": str(name), **(entry or {})})
        return entries
    if isinstance(datasets, list):
        for i, entry in enumerate(datasets):
            if not isinstance(entry, dict):
                raise SlimeError(
                    f"{where}.datasets[{i}]: expected a mapping with name and path, got {type(entry).__name__}"
                )
            if "name" not in entry:
                raise SlimeError(f"{where}.datasets[{i}]: no `name`; each data set needs one")
        return [dict(entry) for entry in datasets]
    raise SlimeError(f"{where}.datasets must be a list or a mapping keyed by name, got {type(datasets).__name__}")


def load_eval_config(path: str, args: argparse.Namespace) -> list[EvalDatasetConfig]:
    """Read `--eval-config`; every unknown key, wrong type or missing field stops here, naming it."""
    root = _read_yaml(path)
    where = f"--eval-config {path}"
    if not isinstance(root, dict):
        raise SlimeError(f"{where}: expected a mapping at the top (eval: {{defaults: ..., datasets: ...}})")
    section = root.get("eval", root)  # slime reads `eval:`, or the whole file
    prefix = f"{where}: eval" if "eval" in root else f"{where}: (top level)"
    if not isinstance(section, dict):
        raise SlimeError(f"{prefix} must be a mapping with datasets (and defaults)")
    _unknown(section, ("defaults", "datasets"), prefix)
    defaults = section.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SlimeError(f"{prefix}.defaults must be a mapping, got {type(defaults).__name__}")
    _unknown(defaults, CONFIG_KEYS, f"{prefix}.defaults")
    for key, value in defaults.items():
        _check_type(key, value, f"{prefix}.defaults")
    entries = _dataset_entries(section.get("datasets"), prefix) if section.get("datasets") is not None else []
    if not entries:
        raise SlimeError(f"{prefix}: no data sets (datasets: is missing or empty)")
    configs, seen, not_used = [], set(), set()
    for entry in entries:
        here = f"{prefix}.datasets[{entry.get('name')!r}]"
        _unknown(entry, CONFIG_KEYS, here)
        for key, value in entry.items():
            _check_type(key, value, here)
        given = {**defaults, **entry}
        name, data_path = given.pop("name"), given.pop("path", None)
        if name in seen:
            raise SlimeError(f"{here}: a second data set of that name (results are reported by name)")
        seen.add(name)
        if not data_path:
            raise SlimeError(f"{here}: no `path`; each data set needs its prompt file")
        _check_values(given, here)
        cfg = resolve_eval_dataset(args, name, data_path, given)
        if (
            cfg.min_new_tokens is not None
            and cfg.max_response_len is not None
            and cfg.min_new_tokens > cfg.max_response_len
        ):
            raise SlimeError(
                f"{here}: min_new_tokens {cfg.min_new_tokens} is more than max_response_len {cfg.max_response_len}"
            )
        not_used |= {k for k in NOT_USED_FIELDS if getattr(cfg, k) is not None}
        configs.append(cfg)
    if not_used:
        logger.warning(
            "%s: %s accepted but not used by this eval rollout (as by slime's own)", where, ", ".join(sorted(not_used))
        )
    return configs


# ---------------------------------------------------------------------------------------------
# slime's builder API: the same resolution as `load_eval_config`, from entries already read


def ensure_dataset_list(config: Any) -> list[dict[str, Any]]:
    """slime's `ensure_dataset_list`: `eval.datasets` as a list of dicts. None is []; a mapping
    keyed by name gives one dict per entry with `name` filled in (an entry's own `name` wins);
    a list or tuple is taken entry by entry, each needing a `name` (ValueError). Anything else
    is a TypeError."""
    if config is None:
        return []
    if isinstance(config, dict):
        return [{"name": name, **dict(entry or {})} for name, entry in config.items()]
    if isinstance(config, (list, tuple)):
        entries = [dict(entry or {}) for entry in config]
        for entry in entries:
            if "name" not in entry:
                raise ValueError("Each evaluation dataset entry must include a `name` field.")
        return entries
    raise TypeError(f"eval.datasets must be either a list or a mapping, got {type(config).__name__}")


def _check_built(given: dict[str, Any], where: str) -> None:
    """What slime's EvalDatasetConfig refuses as it is built (the dataclass here takes it as is)."""
    overrides = given.get("metadata_overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError(f"{where}: metadata_overrides must be a mapping.")
    if given.get("min_eval_samples") is not None and given["min_eval_samples"] <= 0:
        raise ValueError(f"{where}: min_eval_samples must be positive when set.")


def build_eval_dataset_configs(
    args: Any, raw_config: Iterable[dict[str, Any]], defaults: dict[str, Any]
) -> list[EvalDatasetConfig]:
    """slime's `build_eval_dataset_configs`: one `EvalDatasetConfig` per entry of `raw_config`
    (each with `name` and `path`), each field from the entry, then `defaults`, then the args
    (`ARG_FALLBACKS`, via `pick_from_args`). A key of `defaults` that is no field is a ValueError;
    one in an entry, or a missing name or path, a TypeError, as slime's dataclass raises."""
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"Unknown key(s) in eval.defaults: {unknown}. Valid keys: {sorted(CONFIG_KEYS)}.")
    configs = []
    for n, entry in enumerate(raw_config):
        given = {**defaults, **dict(entry or {})}
        where = f"eval dataset {given.get('name', n)!r}"
        extra = sorted(set(given) - set(CONFIG_KEYS))
        if extra:
            raise TypeError(f"{where}: unexpected key(s) {extra}")
        missing = [key for key in ("name", "path") if key not in given]
        if missing:
            raise TypeError(f"{where}: missing required field(s) {missing}")
        name, path = given.pop("name"), given.pop("path")
        _check_built(given, where)
        configs.append(resolve_eval_dataset(args, name, path, given))
    return configs
