"""slime's `--sglang-config`: several models, each with its own engines and router.

The YAML (slime's schema, docs/multi-model.md):

    sglang:
      - name: actor                 # unique; the key of args.sglang_model_routers
        model_path: /path           # default --hf-checkpoint
        update_weights: true        # default: true when model_path is --hf-checkpoint, else false
        num_gpus_per_engine: 1      # default --rollout-num-gpus-per-engine
        server_groups:              # (engine_groups: slime's older name)
          - worker_type: regular    # regular | prefill | decode | placeholder
            num_gpus: 2
            num_gpus_per_engine: 1  # default: the model's
            overrides: {context_length: 512}   # engine server arguments for this group

`load_sglang_config(args)` reads and checks it (every error names the file, the model and the
key) and resolves slime's defaults; without `--sglang-config` it describes the run's one model
("default"), with `--prefill-num-servers` split into a prefill and a decode group as slime does.
`check_sglang_config(args)` is the preflight: that, the mutual exclusions, every model's
checkpoint and every group's overrides against the engine's own parser, before anything starts.

The policy is the first model whose weights are updated: its engines serve the default rollout
and receive every weight sync; the others are frozen (never synced, offloaded or restarted with
the policy's weights). Prefill/decode groups run as regular engines here (no disaggregation).
"""

from __future__ import annotations

import difflib
import json
import os
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slime.arguments.engine import sort_passthrough
from slime.engine.args import check_model_dir
from slime.errors import SlimeError
from slime.ray.engine_launch import validate_sglang_args

WORKER_TYPES = ("regular", "prefill", "decode", "placeholder")
MODEL_KEYS = ("name", "model_path", "update_weights", "num_gpus_per_engine", "server_groups", "engine_groups")
GROUP_KEYS = ("worker_type", "num_gpus", "num_gpus_per_engine", "overrides")
# Set by the framework per engine (address, keys, placement, tensor parallelism): not an override.
FRAMEWORK_OWNED_OVERRIDES = (
    "host",
    "port",
    "api_key",
    "admin_api_key",
    "tp_size",
    "tensor_parallel_size",
    "base_gpu_id",
    "weight_load_dirs",
    "parent_pid",
)
PD_NOTE = (
    "prefill/decode server groups run as regular engines behind their model's router "
    "(no prefill/decode disaggregation in slime-rl)"
)


@dataclass
class ServerGroup:
    worker_type: str
    num_gpus: int
    num_gpus_per_engine: int
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def num_engines(self) -> int:
        return 0 if self.worker_type == "placeholder" else self.num_gpus // self.num_gpus_per_engine

    def override_args(self) -> list[str]:
        """The overrides as engine command-line arguments (`model_path` is the model's, not one)."""
        return override_tokens({k: v for k, v in self.overrides.items() if k != "model_path"})


@dataclass
class ModelSpec:
    name: str
    model_path: str
    update_weights: bool
    groups: list[ServerGroup]

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    @property
    def num_engines(self) -> int:
        return sum(g.num_engines for g in self.groups)

    @property
    def has_pd(self) -> bool:
        return any(g.worker_type in ("prefill", "decode") for g in self.groups)


@dataclass
class SglangConfig:
    source: str  # "--sglang-config <path>", or what the models come from without one
    models: list[ModelSpec]
    notes: list[str] = field(default_factory=list)

    @property
    def policy(self) -> ModelSpec:
        """The model that receives the trained weights and serves the default rollout."""
        return next(m for m in self.models if m.update_weights)

    @property
    def frozen(self) -> list[ModelSpec]:
        return [m for m in self.models if m is not self.policy]


def override_tokens(overrides: dict[str, Any]) -> list[str]:
    """`{context_length: 512, enable_x: true}` -> `--context-length 512 --enable-x` (SGLang's
    ServerArgs field names, as its command line spells them); false drops a flag."""
    tokens: list[str] = []
    for key, value in overrides.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            tokens.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            tokens += [flag, *map(str, value)]
        elif isinstance(value, dict):
            tokens += [flag, json.dumps(value)]
        else:
            tokens += [flag, str(value)]
    return tokens


class _Where:
    """Error messages that name the file, the model and the key."""

    def __init__(self, path: str):
        self.path = path

    def error(self, where: str, message: str) -> SlimeError:
        return SlimeError(f"--sglang-config {self.path}: {where}: {message}")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _unknown_keys(w: _Where, where: str, raw: dict, known: tuple[str, ...]) -> None:
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise w.error(where, f"unknown key {key!r}{hint}")


def _read_yaml(path: str) -> list:
    w = _Where(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SlimeError(f"--sglang-config {path}: cannot read it ({e.strerror or e})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SlimeError(f"--sglang-config {path}: not valid YAML: {e}") from e
    if not isinstance(data, dict) or "sglang" not in data:
        got = list(data) if isinstance(data, dict) else type(data).__name__
        raise w.error("top level", f"needs a 'sglang' key holding the list of models (got {got})")
    if len(data) > 1:
        raise w.error("top level", f"unknown keys {sorted(k for k in data if k != 'sglang')} (only 'sglang')")
    models = data["sglang"]
    if not isinstance(models, list) or not models:
        raise w.error("sglang", "must be a non-empty list of models")
    return models


def _parse_group(w: _Where, where: str, raw: Any, default_gpe: int, unit: int) -> ServerGroup:
    if not isinstance(raw, dict):
        raise w.error(where, f"must be a mapping with {', '.join(GROUP_KEYS)} (got {type(raw).__name__})")
    _unknown_keys(w, where, raw, GROUP_KEYS)
    kind = raw.get("worker_type")
    if kind == "encoder":
        raise w.error(f"{where}.worker_type", "'encoder' groups (multimodal EPD) are not supported in slime-rl")
    if kind not in WORKER_TYPES:
        raise w.error(f"{where}.worker_type", f"must be one of {', '.join(WORKER_TYPES)}, got {kind!r}")
    num_gpus = raw.get("num_gpus")
    if not _positive_int(num_gpus):
        raise w.error(f"{where}.num_gpus", f"must be a positive integer, got {num_gpus!r}")
    gpe = raw.get("num_gpus_per_engine", default_gpe)
    if not _positive_int(gpe):
        raise w.error(f"{where}.num_gpus_per_engine", f"must be a positive integer, got {gpe!r}")
    if num_gpus % gpe:
        raise w.error(f"{where}.num_gpus", f"{num_gpus} is not a multiple of num_gpus_per_engine {gpe}")
    if gpe % unit:
        raise w.error(
            f"{where}.num_gpus_per_engine",
            f"{gpe} is not a multiple of --rollout-num-gpus-per-engine {unit} (the run's placement unit)",
        )
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise w.error(f"{where}.overrides", f"must be a mapping of server arguments, got {type(overrides).__name__}")
    for key in overrides:
        if str(key) in FRAMEWORK_OWNED_OVERRIDES:
            raise w.error(f"{where}.overrides.{key}", "is set by the framework for each engine; remove it")
    return ServerGroup(kind, num_gpus, gpe, dict(overrides))


def _same_checkpoint(a: str, b: str | None) -> bool:
    return b is not None and os.path.realpath(a) == os.path.realpath(b)


def _parse_model(w: _Where, i: int, raw: Any, args: Namespace, notes: list[str]) -> ModelSpec:
    if not isinstance(raw, dict):
        raise w.error(f"sglang[{i}]", f"must be a mapping with name and server_groups (got {type(raw).__name__})")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise w.error(f"sglang[{i}].name", f"must be a non-empty string, got {name!r}")
    where = f"model {name!r} (sglang[{i}])"
    _unknown_keys(w, where, raw, MODEL_KEYS)
    gpe = raw.get("num_gpus_per_engine", args.rollout_num_gpus_per_engine)
    if not _positive_int(gpe):
        raise w.error(f"{where} num_gpus_per_engine", f"must be a positive integer, got {gpe!r}")
    key = "server_groups" if "server_groups" in raw else "engine_groups"
    raw_groups = raw.get(key)
    if not isinstance(raw_groups, list) or not raw_groups:
        raise w.error(f"{where} server_groups", "is required: a non-empty list of server groups")
    groups = [
        _parse_group(w, f"{where} {key}[{j}]", g, gpe, args.rollout_num_gpus_per_engine)
        for j, g in enumerate(raw_groups)
    ]
    path = raw.get("model_path")
    if path is not None and not isinstance(path, str):
        raise w.error(f"{where} model_path", f"must be a path, got {path!r}")
    paths = {str(g.overrides.get("model_path", path or args.hf_checkpoint)) for g in groups}
    if len(paths) > 1:
        raise w.error(f"{where} overrides.model_path", f"server groups name different checkpoints {sorted(paths)}")
    model_path = paths.pop()
    kinds = {g.worker_type for g in groups} - {"placeholder"}
    if not kinds:
        raise w.error(f"{where} server_groups", "has only placeholder groups: no engine would serve the model")
    if "regular" in kinds and kinds & {"prefill", "decode"}:
        raise w.error(f"{where} server_groups", "mixes regular groups with prefill/decode groups (slime's rule)")
    update = raw.get("update_weights")
    if update is not None and not isinstance(update, bool):
        raise w.error(f"{where} update_weights", f"must be true or false, got {update!r}")
    if update is None:  # slime's inference: the trained checkpoint's copy is updated
        update = _same_checkpoint(model_path, args.hf_checkpoint)
        if not update:
            notes.append(
                f"--sglang-config {w.path}: model {name!r} serves {model_path}, not --hf-checkpoint: it is frozen "
                f"(update_weights: false; set update_weights explicitly to silence this)"
            )
    return ModelSpec(name, model_path, update, groups)


def _choose_policy(w: _Where, raws: list, models: list[ModelSpec], notes: list[str]) -> None:
    """The first updated model is the policy; a later one whose update_weights was inferred is
    frozen (slime syncs one model only), one that asks for updates explicitly is an error."""
    updated = [m for m in models if m.update_weights]
    if not updated:
        raise w.error("sglang", "no model receives the trained weights: set update_weights: true on the policy model")
    for m in updated[1:]:
        raw = raws[models.index(m)]
        if raw.get("update_weights") is True:
            raise w.error(
                f"model {m.name!r} update_weights",
                f"only one model receives the trained weights (the policy {updated[0].name!r}); "
                "set update_weights: false",
            )
        m.update_weights = False
        notes.append(
            f"--sglang-config {w.path}: model {m.name!r} also serves --hf-checkpoint but only the policy "
            f"{updated[0].name!r} receives the trained weights: {m.name!r} stays frozen"
        )


def parse_sglang_config(path: str, args: Namespace) -> SglangConfig:
    """Read and check the YAML; slime's defaults resolved, one model per entry."""
    w = _Where(path)
    raws = _read_yaml(path)
    notes: list[str] = []
    models = [_parse_model(w, i, raw, args, notes) for i, raw in enumerate(raws)]
    names = [m.name for m in models]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise w.error("sglang", f"model names must be unique; {dup} appear more than once")
    _choose_policy(w, raws, models, notes)
    total = sum(m.num_gpus for m in models)
    if total != args.rollout_num_gpus:
        raise w.error(
            "num_gpus",
            f"the server groups' num_gpus add up to {total}, but --rollout-num-gpus is {args.rollout_num_gpus}; "
            "they must be equal",
        )
    if any(m.has_pd for m in models):
        notes.append(PD_NOTE)
    return SglangConfig(f"--sglang-config {path}", models, notes)


def load_sglang_config(args: Namespace) -> SglangConfig:
    """The run's models: `--sglang-config`'s, else one "default" model on every engine slot
    (with `--prefill-num-servers`: a prefill group of that many engines and a decode group)."""
    if args.sglang_config is not None:
        return parse_sglang_config(args.sglang_config, args)
    unit = args.rollout_num_gpus_per_engine
    if args.prefill_num_servers is None:
        groups = [ServerGroup("regular", args.rollout_num_gpus, unit)]
        return SglangConfig("the command line", [ModelSpec("default", args.hf_checkpoint, True, groups)])
    prefill = args.prefill_num_servers * unit
    decode = args.rollout_num_gpus - prefill
    if args.prefill_num_servers < 1 or decode <= 0:
        raise SlimeError(
            f"--prefill-num-servers {args.prefill_num_servers}: {prefill} of --rollout-num-gpus "
            f"{args.rollout_num_gpus} for prefill leaves {max(decode, 0)} for decode; it must leave some"
        )
    groups = [ServerGroup("prefill", prefill, unit), ServerGroup("decode", decode, unit)]
    model = ModelSpec("default", args.hf_checkpoint, True, groups)
    return SglangConfig("--prefill-num-servers", [model], [PD_NOTE])


def check_exclusions(args: Namespace) -> None:
    """slime's mutual exclusions, and the external router (this run starts every model's)."""
    if args.sglang_config is not None and args.prefill_num_servers is not None:
        raise SlimeError(
            "--sglang-config and --prefill-num-servers are mutually exclusive: give prefill/decode server_groups "
            "in the YAML instead"
        )
    for opt, value in (("--sglang-config", args.sglang_config), ("--prefill-num-servers", args.prefill_num_servers)):
        if value is not None and args.rollout_external_engine_addrs is not None:
            raise SlimeError(
                f"{opt} cannot be used with --rollout-external-engine-addrs (engines this run does not start)"
            )
    if args.sglang_config is not None and args.sglang_router_ip is not None:
        raise SlimeError(
            "--sglang-config starts every model's engines and router; --sglang-router-ip names a router this run "
            "does not start: drop one of them"
        )


def check_overrides(config: SglangConfig, backend: str) -> list[str]:
    """Every group's overrides against the engine's arguments; notes for SGLang-only ones."""
    notes = []
    for m in config.models:
        for j, g in enumerate(m.groups):
            tokens = g.override_args()
            where = f"{config.source}: model {m.name!r} server_groups[{j}].overrides"
            try:
                if backend == "sglang":
                    validate_sglang_args(tokens)
                    continue
                _, not_used = sort_passthrough(tokens, "builtin")
            except SlimeError as e:
                raise SlimeError(f"{where}: {str(e).replace('--sglang-', '--')}") from e
            if not_used:
                unused = "; ".join(t.removeprefix("--sglang-") for t in not_used)
                notes.append(f"{where}: SGLang options the built-in engine does not use: {unused}")
    return notes


def check_sglang_config(args: Namespace) -> list[str]:
    """Preflight of `--sglang-config` / `--prefill-num-servers`: the notes to print at start-up."""
    check_exclusions(args)
    if args.sglang_config is None and args.prefill_num_servers is None:
        return []
    config = load_sglang_config(args)
    for m in config.models:
        if m.model_path != args.hf_checkpoint:
            check_model_dir(m.model_path, f"{config.source}: model {m.name!r} model_path")
    notes = list(config.notes)
    if any(g.worker_type == "placeholder" for m in config.models for g in m.groups):
        notes.append(f"{config.source}: placeholder groups keep their engine slots free (no engines)")
    return notes + check_overrides(config, args.rollout_backend)
