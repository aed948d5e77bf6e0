"""Weights: `/update_weights_from_tensor` (base64 safetensors), `/update_weights_from_disk`, and
the distributed path (`/init_weights_update_group`, `/update_weights_from_distributed`,
`/destroy_weights_update_group`) over a gloo group the trainer hosts (`slime.engine.weight_group`).

Every update is checked against the model before it is applied, waits for the running batch
(unless the client asked for an in-place swap with `flush_cache: false`), drops cached KV and
bumps `weight_version`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import math
import mmap
import os
import stat
import warnings
from collections.abc import Callable

import torch
from fastapi import FastAPI
from fastapi.responses import Response
from safetensors.torch import load as load_safetensors

from slime.engine import weight_delta
from slime.engine.http import error_response, route
from slime.engine.lora_weights import LoraBaseMissing, LoraRequest, LoraUpdateError
from slime.engine.model_runner import ModelRunner, WeightUpdateError
from slime.engine.sampling import BadRequest
from slime.engine.state import EngineState
from slime.engine.weight_group import DEFAULT_GROUP_NAME, create_gloo_group, parse_dtype
from slime.utils import tensor_ipc


def add_weight_routes(app: FastAPI, state: EngineState) -> None:
    async def update_weights_from_tensor(body: dict):
        blobs = body.get("serialized_named_tensors")
        if isinstance(blobs, str):
            blobs = [blobs]
        if not isinstance(blobs, list) or not blobs or not all(isinstance(b, str) for b in blobs):
            raise BadRequest("serialized_named_tensors must be a non-empty list of base64 strings")
        fmt = body.get("load_format")
        if fmt not in (None, "safetensors", "safetensors_base64", tensor_ipc.LOAD_FORMAT):
            raise BadRequest(
                f"load_format {fmt!r} is not supported (base64 safetensors, or "
                f"{tensor_ipc.LOAD_FORMAT!r}: torch IPC handles from a process on this machine)"
            )
        # torch_ipc: CUDA IPC handles / shared-memory names of the sender's tensors (slime.utils.tensor_ipc)
        read = tensor_ipc.loads if fmt == tensor_ipc.LOAD_FORMAT else load_safetensors

        def decode():
            named = {}
            for b in blobs:
                named.update(read(base64.b64decode(b)))
            return named

        try:
            named = await asyncio.to_thread(decode)
        except Exception as e:  # noqa: BLE001
            raise BadRequest(f"cannot decode serialized_named_tensors: {type(e).__name__}: {e}") from None
        return await apply_update(state, named, body, "update_weights_from_tensor")

    async def update_weights_from_disk(body: dict):
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path must be a directory path")
        if not disk_load_allowed(state, path):
            return error_response(
                f"update_weights_from_disk: {path!r} is not under --model-path or a "
                "--weight-load-dirs directory of this server",
                403,
            )
        try:
            named = await asyncio.to_thread(ModelRunner.read_safetensors_dir, path, _file_check(state, path))
        except WeightUpdateError as e:
            raise BadRequest(f"update_weights_from_disk: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise BadRequest(f"update_weights_from_disk: cannot read {path!r}: {type(e).__name__}: {e}") from None
        answer = await apply_update(state, named, body, "update_weights_from_disk")
        if isinstance(answer, dict):  # loaded (a refused adapter, HTTP 409, changed nothing)
            state.model_path = path
        return answer

    route(app, "/update_weights_from_tensor", update_weights_from_tensor, allow_empty=False)
    route(app, "/update_weights_from_disk", update_weights_from_disk, allow_empty=False)
    _add_group_routes(app, state)
    _add_shared_memory_route(app, state)
    _add_pull_route(app, state)


def disk_load_allowed(state: EngineState, path: str) -> bool:
    """`path` is --model-path itself or inside one of --weight-load-dirs (symlinks resolved):
    a caller must not make the server read whatever file it can name."""
    return _is_model_path(state, path) or inside_load_dirs(state, path)


def inside_load_dirs(state: EngineState, path: str) -> bool:
    """`path`, symlinks resolved, is one of --weight-load-dirs or inside one."""
    real = os.path.realpath(path)
    return any(_within(real, os.path.realpath(d)) for d in state.args.weight_load_dirs)


def _is_model_path(state: EngineState, path: str) -> bool:
    return os.path.realpath(path) == os.path.realpath(state.args.model_path)


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _file_check(state: EngineState, path: str) -> Callable[[str], bool] | None:
    """What each weight file read for a load of `path` must pass: none for --model-path (the
    operator's own directory; a hub cache holds symlinks into its blobs), else it must resolve
    inside the --weight-load-dirs."""
    return None if _is_model_path(state, path) else functools.partial(inside_load_dirs, state)


async def apply_update(state: EngineState, named: dict[str, torch.Tensor], body: dict, what: str) -> dict | Response:
    """Check `named` against the model, then swap it in between batches; BadRequest if it does not fit.
    An update with a `lora` field carries an adapter, merged here into the base the engine keeps
    (`slime.engine.lora_weights`); any other update replaces weights wholesale and drops that base."""
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise BadRequest("weight_version must be a string")
    lora = None
    try:
        lora = LoraRequest.parse(body)
        if lora is not None:
            named = await asyncio.to_thread(state.lora.expand, named, lora, version is not None)
        if named:
            state.runner.validate_named_tensors(named)
    except LoraBaseMissing as e:
        return error_response(f"{what}: {e}", 409)
    except (LoraUpdateError, WeightUpdateError) as e:
        if lora is not None:
            state.lora.clear()
        raise BadRequest(f"{what}: {e}") from None
    if not named and version is None:  # a bucket of base weights only: kept, nothing to load yet
        return {"success": True, "message": f"{what}: base weights kept", "num_tensors": 0}
    if body.get("abort_all_requests"):
        state.scheduler.abort(abort_all=True)

    def load():
        if lora is None:
            state.lora.clear()
        n = state.runner.load_named_tensors(named) if named else 0
        return n, state.bump_version(version)

    try:
        n, v = await state.control(load, needs_idle=bool(body.get("flush_cache", True)))
    except WeightUpdateError as e:
        raise BadRequest(f"{what}: {e}") from None
    return {
        "success": True,
        "message": f"{what}: updated {n} tensors; weight_version {v}",
        "weight_version": v,
        "num_tensors": n,
    }


# ------------------------------------------------------------------------------ distributed update
def _int_field(body: dict, key: str, lo: int, hi: int | None = None) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise BadRequest(f"{key} must be an integer {rng}, got {v!r}")
    return v


def _group_name(body: dict) -> str:
    name = body.get("group_name", DEFAULT_GROUP_NAME)
    if not isinstance(name, str) or not name:
        raise BadRequest(f"group_name must be a non-empty string, got {name!r}")
    return name


def _nonempty_list(body: dict, key: str) -> list:
    v = body.get(key)
    if not isinstance(v, list) or not v:
        raise BadRequest(f"{key} must be a non-empty list")
    return v


def _tensor_specs(body: dict) -> list[tuple[str, torch.dtype, list[int]]]:
    """(name, dtype, shape) of every tensor an update announces, in broadcast order."""
    names, dtypes, shapes = (_nonempty_list(body, key) for key in ("names", "dtypes", "shapes"))
    if not len(names) == len(dtypes) == len(shapes):
        raise BadRequest(
            f"names, dtypes and shapes must have equal lengths, got {len(names)}, {len(dtypes)}, {len(shapes)}"
        )
    specs = []
    for n, d, sh in zip(names, dtypes, shapes, strict=True):
        if not isinstance(n, str):
            raise BadRequest(f"names must be strings, got {n!r}")
        try:
            dt = parse_dtype(d)
        except ValueError as e:
            raise BadRequest(f"dtype of {n!r}: {e}") from None
        if not isinstance(sh, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sh):
            raise BadRequest(f"shape of {n!r} must be a list of non-negative integers, got {sh!r}")
        specs.append((n, dt, sh))
    return specs


def _check_announced_size(state: EngineState, specs: list[tuple[str, torch.dtype, list[int]]]) -> None:
    """No update is larger than the model's weights in float32, twice over: the client chooses the
    shapes the server allocates."""
    announced = sum(math.prod(sh) * dt.itemsize for _, dt, sh in specs)
    limit = 2 * 4 * sum(p.numel() for p in state.runner.model.parameters())
    if announced > limit:
        raise BadRequest(
            f"the update announces {announced} bytes, more than this model's weights could take ({limit} bytes)"
        )


def _add_group_routes(app: FastAPI, state: EngineState) -> None:
    async def init_weights_update_group(body: dict):
        addr = body.get("master_address")
        if not isinstance(addr, str) or not addr:
            raise BadRequest(f"master_address must be a host name or address, got {addr!r}")
        port = _int_field(body, "master_port", 1, 65535)
        world = _int_field(body, "world_size", 2)
        rank = _int_field(body, "rank_offset", 1, world - 1)  # one rank per engine (no tensor parallel)
        name = _group_name(body)
        backend = body.get("backend", "gloo")
        if backend != "gloo":
            raise BadRequest(f"backend {backend!r} is not available in the built-in (CPU) engine; use 'gloo'")
        if name in state.weight_groups:
            raise BadRequest(f"weight update group {name!r} already exists; destroy it first")
        timeout = body.get("timeout", 120)
        timeout = float(timeout) if isinstance(timeout, (int, float)) else 120.0
        try:
            pg = await asyncio.to_thread(create_gloo_group, addr, port, rank, world, name, timeout)
        except Exception as e:  # noqa: BLE001 - rendezvous failed (wrong address/port, timeout)
            raise BadRequest(
                f"init_weights_update_group: cannot join {name!r} at {addr}:{port} as rank {rank} "
                f"of {world}: {type(e).__name__}: {e}"
            ) from None
        state.weight_groups[name] = pg
        state.weight_group_locks[name] = asyncio.Lock()
        return {"success": True, "message": f"joined weight update group {name!r} as rank {rank} of {world}"}

    async def destroy_weights_update_group(body: dict):
        name = _group_name(body)
        if name not in state.weight_groups:
            raise BadRequest(f"no weight update group {name!r}")
        state.weight_group_locks.pop(name, None)
        state.weight_groups.pop(name).shutdown()
        return {"success": True, "message": f"weight update group {name!r} destroyed"}

    async def update_weights_from_distributed(body: dict):
        specs = _tensor_specs(body)
        name = _group_name(body)
        if name not in state.weight_groups:
            raise BadRequest(f"no weight update group {name!r}; call /init_weights_update_group first")
        if body.get("load_format") is not None:
            raise BadRequest(f"load_format {body['load_format']!r} is not supported by update_weights_from_distributed")
        _check_announced_size(state, specs)
        pg = state.weight_groups[name]

        def receive():
            # Every tensor announced is received, even ones the model will reject, so the
            # sender's broadcasts complete and the group stays usable.
            out = {}
            for n, dt, sh in specs:
                t = torch.empty(sh, dtype=dt)
                pg.broadcast(t, root=0)
                out[n] = t
            return out

        async with state.weight_group_locks[name]:
            try:
                named = await asyncio.to_thread(receive)
            except Exception as e:  # noqa: BLE001
                state.weight_groups.pop(name, None)  # a broken group is not reused
                state.weight_group_locks.pop(name, None)
                return error_response(
                    f"update_weights_from_distributed: broadcast in {name!r} failed: {type(e).__name__}: {e}", 500
                )
        return await apply_update(state, named, body, "update_weights_from_distributed")

    route(app, "/init_weights_update_group", init_weights_update_group, allow_empty=False)
    route(app, "/destroy_weights_update_group", destroy_weights_update_group)
    route(app, "/update_weights_from_distributed", update_weights_from_distributed, allow_empty=False)


# ------------------------------------------------------------------------------ shared memory
SHM_DIR = "/dev/shm"
SHM_PREFIX = "slime-weights-"


def _add_shared_memory_route(app: FastAPI, state: EngineState) -> None:
    """`/update_weights_from_shared_memory {path, size, names, dtypes, shapes, offsets, weight_version,
    flush_cache}`: the trainer on this machine wrote the weights into a file under /dev/shm; the
    engine maps it (once per buffer, kept between updates) and copies the tensors into its model
    between batches. Only the control message crosses HTTP."""
    mapped: dict = {}  # the current buffer: {"key": (path, size, inode), "map": mmap, "bytes": uint8 tensor}

    def buffer_for(path: str, size: int) -> torch.Tensor:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BadRequest(f"path {path!r} is not a regular file")
            if st.st_size != size:
                raise BadRequest(f"path {path!r} holds {st.st_size} bytes, the update announces {size}")
            key = (path, size, st.st_ino)
            if mapped.get("key") != key:
                old = mapped.pop("map", None)
                mapped.clear()
                if old is not None:
                    old.close()
                mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # read-only buffer: the engine never writes it
                    mapped.update(key=key, map=mm, bytes=torch.frombuffer(mm, dtype=torch.uint8))
            return mapped["bytes"]
        finally:
            os.close(fd)

    async def update_weights_from_shared_memory(body: dict):
        path = body.get("path")
        if (
            not isinstance(path, str)
            or os.path.dirname(path) != SHM_DIR
            or not os.path.basename(path).startswith(SHM_PREFIX)
            or os.path.realpath(path) != path
        ):
            raise BadRequest(f"path must be a file {SHM_DIR}/{SHM_PREFIX}*, got {path!r}")
        size = _int_field(body, "size", 1)
        specs = _tensor_specs(body)
        offsets = body.get("offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != len(specs)
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        ):
            raise BadRequest("offsets must be a list of non-negative integers, one per name")
        _check_announced_size(state, specs)
        for (n, dt, sh), off in zip(specs, offsets, strict=True):
            if off % dt.itemsize or off + math.prod(sh) * dt.itemsize > size:
                raise BadRequest(f"{n!r} at offset {off} does not fit a buffer of {size} bytes (or is misaligned)")
        try:
            buf = buffer_for(path, size)
        except FileNotFoundError:
            raise BadRequest(
                f"no shared-memory buffer {path!r} on this machine (the trainer must run on the "
                "engine's machine for this transport)"
            ) from None
        named = {
            n: buf[off : off + math.prod(sh) * dt.itemsize].view(dt).view(sh)
            for (n, dt, sh), off in zip(specs, offsets, strict=True)
        }
        return await apply_update(state, named, body, "update_weights_from_shared_memory")

    route(app, "/update_weights_from_shared_memory", update_weights_from_shared_memory, allow_empty=False)


# ------------------------------------------------------------------------------ disk versions
def _add_pull_route(app: FastAPI, state: EngineState) -> None:
    """`/pull_weights {local_checkpoint_dir, source_dir, target_version}` (slime's sglang patch):
    bring the local checkpoint up to the published version (copy a full one, patch deltas in
    place, check each patched tensor's checksum); the engine then reloads it with
    `/update_weights_from_disk`. Both directories must be --weight-load-dirs of this server."""
    lock = asyncio.Lock()

    async def pull_weights(body: dict):
        local, source = body.get("local_checkpoint_dir"), body.get("source_dir")
        if not isinstance(local, str) or not local:
            raise BadRequest("local_checkpoint_dir must be a directory path")
        if not isinstance(source, str) or not source:
            raise BadRequest("source_dir must be a directory path")
        for key, v, allowed in (
            ("local_checkpoint_dir", local, inside_load_dirs),  # written to: never --model-path
            ("source_dir", source, disk_load_allowed),
        ):
            if not allowed(state, v):
                return error_response(
                    f"pull_weights: {key} {v!r} is not under a --weight-load-dirs directory of this server", 403
                )
        real_local, real_model = os.path.realpath(local), os.path.realpath(state.args.model_path)
        if _within(real_local, real_model) or _within(real_model, real_local):
            # /pull_weights writes into local_checkpoint_dir: never into the served model's files
            return error_response(
                f"pull_weights: local_checkpoint_dir {local!r} overlaps the served model's directory "
                "(--model-path), which /pull_weights would write into; give a directory of its own",
                403,
            )
        target = _int_field(body, "target_version", 0)
        file_ok = functools.partial(inside_load_dirs, state)
        async with lock:
            try:
                done = await asyncio.to_thread(weight_delta.pull, local, state.args.model_path, source, target, file_ok)
            except weight_delta.DeltaChecksumError as e:
                return error_response(f"pull_weights: {e}", 409)
            except (weight_delta.DeltaError, OSError, KeyError, ValueError) as e:
                return error_response(f"pull_weights: {type(e).__name__}: {e}", 400)
        return {"success": True, "message": f"local checkpoint at version {done['version']}", **done}

    route(app, "/pull_weights", pull_weights, allow_empty=False)
