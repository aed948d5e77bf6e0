"""Disk weight sync (`--update-weight-transport disk`), full or delta (slime's design and format).

Every sync is one version directory `weight_v{N:06d}/` under `--update-weight-disk-dir`
(format: `slime.engine.weight_delta`):

* **full**: an HF checkpoint of every weight; the engines reload it with
  `/update_weights_from_disk` (or, with `--update-weight-local-checkpoint-dir`, first copy it
  there with `/pull_weights`). Removed once every engine has loaded it unless
  `--update-weight-disk-keep-files`. A LoRA run's full version may hold its adapter alone (and
  the base, the first time), which the engines merge (`slime.engine.lora_weights`).
* **delta** (`--update-weight-mode delta`): the trainer keeps a CPU snapshot of the weights the
  engines hold, seeded from `--hf-checkpoint` (the engines' own base, byte for byte); each sync
  writes only the changed tensors, encoded (`--update-weight-delta-encoding`) and zstd-compressed,
  with a checksum of each new tensor (`--update-weight-delta-checksum`). Each engine patches its
  local checkpoint (`/pull_weights`), checks the checksums and reloads it. An engine that refuses
  a delta (checksum mismatch, HTTP 409) gets a full version next, in the same sync; the refusals
  are counted (`perf/weight_sync_delta_refused`).

`--custom-update-weight-post-write-path` is called after a version's files are written, before any
engine reads them: `hook(args, version_dir, rollout_engines)` (the engines' URLs here).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

from slime.engine import weight_delta as fmt
from slime.engine.client import client_for
from slime.errors import SlimeError
from slime.sync.tensor import dedupe_tied
from slime.utils.http_utils import HTTPRequestError

logger = logging.getLogger(__name__)

DELTA_FILE_BYTES = 1 << 30  # tensors per delta safetensors file, at most this many compressed bytes


def _u8(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy()


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory's safetensors files, as stored."""
    out: dict[str, torch.Tensor] = {}
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise SlimeError(
            f"--hf-checkpoint {str(path)!r} has no *.safetensors files (delta weight sync diffs against them)"
        )
    for f in files:
        out.update(load_file(str(f)))
    return out


class DiskWeightSync:
    def __init__(
        self,
        *,
        disk_dir: str,
        mode: str = "full",
        local_dir: str | None = None,
        keep_files: bool = False,
        encoding: str = "xor",
        checksum: str = "xxh3-128",
        base_checkpoint: str | None = None,
        post_write: Callable[[str, list[str]], Any] | None = None,
    ) -> None:
        self.disk_dir = Path(disk_dir)
        self.mode, self.local_dir, self.keep_files = mode, local_dir, keep_files
        self.encoding, self.checksum = encoding, checksum
        self.base_checkpoint = base_checkpoint
        self.post_write = post_write
        self.version = 0
        self.snapshot: dict[str, torch.Tensor] | None = None  # delta: what the engines hold
        self.started = False
        self.refused = 0  # deltas engines refused (each followed by a full version)
        self.last: dict[str, float] = {}

    # ------------------------------------------------------------------ start
    def _start(self, engine_urls: list[str]) -> None:
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        for old in self.disk_dir.glob("weight_v*"):  # an earlier run's versions: this run counts from 0 again
            if re.fullmatch(r"weight_v\d{6}", old.name) and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        if self.mode == "delta":
            if self.base_checkpoint is None:
                raise SlimeError("delta weight sync needs the engines' starting checkpoint (--hf-checkpoint)")
            self.snapshot = {n: t.clone() for n, t in read_checkpoint(self.base_checkpoint).items()}
            self._each(engine_urls, lambda c: c._call("POST", "/pull_weights", self._pull_body(0)))
        self.started = True

    def _pull_body(self, version: int) -> dict:
        return {
            "local_checkpoint_dir": str(self.local_dir),
            "source_dir": str(self.disk_dir),
            "target_version": version,
        }

    @staticmethod
    def _each(urls: list[str], fn: Callable) -> list:
        with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
            futs = [pool.submit(fn, client_for(u)) for u in urls]  # one per url, in order
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001
                out.append(e)
        return out

    # ------------------------------------------------------------------ write
    def _held(self) -> dict[str, torch.Tensor]:
        """Delta mode's snapshot of what the engines hold (taken at start)."""
        assert self.snapshot is not None, "delta weight sync writes only after it started"
        return self.snapshot

    def _new_values(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The trainer's weights under the snapshot's names and dtypes (tied names included)."""
        held = self._held()
        missing = [n for n in held if n not in state]
        if missing:
            raise SlimeError(f"delta weight sync: the trainer has no weight {missing[:3]} that --hf-checkpoint has")
        return {n: state[n].detach().to(held[n].dtype).contiguous() for n in held}

    def write_full(self, state: dict[str, torch.Tensor]) -> tuple[Path, int]:
        self.version += 1
        vdir = fmt.version_dir(self.disk_dir, self.version)
        tmp = vdir.with_name(vdir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.snapshot is not None:
            tensors = self._new_values(state)
        else:  # in the checkpoint's dtypes (an HF checkpoint of the served model, as slime writes)
            dtypes = self._base_dtypes()
            tensors = {n: t.detach().to(dtypes.get(n, t.dtype)).contiguous() for n, t in dedupe_tied(state).items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (tmp / fmt.INDEX).write_text(
            json.dumps(
                {
                    "metadata": {"version": self.version, "total_size": total},
                    "weight_map": dict.fromkeys(tensors, "model.safetensors"),
                }
            )
        )
        os.replace(tmp, vdir)
        if self.snapshot is not None:
            self.snapshot = {n: t.clone() for n, t in tensors.items()}
        return vdir, _dir_bytes(vdir)

    def write_delta(self, state: dict[str, torch.Tensor]) -> tuple[Path, int, int]:
        """(version dir, bytes written, tensors changed)."""
        new = self._new_values(state)
        held = self._held()
        base = self.version
        self.version += 1
        vdir = fmt.version_dir(self.disk_dir, self.version)
        tmp = vdir.with_name(vdir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)

        def one(name: str):
            a, b = _u8(new[name]), _u8(held[name])
            raw = fmt.encode(self.encoding, a, b)
            if raw is None:
                return name, None, None
            return name, np.frombuffer(fmt.compress(raw), np.uint8), fmt.checksum(self.checksum, a)

        with ThreadPoolExecutor(max_workers=fmt.WORKERS) as pool:
            results = list(pool.map(one, list(new)))
        files: list[tuple[dict, dict]] = [({}, {})]
        size = 0
        for name, blob, digest in results:
            if blob is None:
                continue
            if files[-1][0] and size + blob.size > DELTA_FILE_BYTES:
                files.append(({}, {}))
                size = 0
            files[-1][0][name] = blob
            files[-1][1][name] = digest
            size += blob.size
        weight_map = {}
        for i, (arrays, digests) in enumerate(f for f in files if f[0]):
            fname = f"model-{i + 1:05d}.safetensors"
            save_numpy(arrays, str(tmp / fname), metadata=digests)
            weight_map.update(dict.fromkeys(arrays, fname))
        (tmp / fmt.INDEX).write_text(
            json.dumps(
                {
                    "metadata": {
                        "version": self.version,
                        "base_version": base,
                        "delta_encoding": self.encoding,
                        "checksum_format": self.checksum,
                        "compression_format": fmt.COMPRESSION,
                    },
                    "weight_map": weight_map,
                }
            )
        )
        os.replace(tmp, vdir)
        self.snapshot = {n: t.clone() for n, t in new.items()}
        return vdir, _dir_bytes(vdir), len(weight_map)

    def _base_dtypes(self) -> dict[str, torch.dtype]:
        if self.base_checkpoint is None:
            return {}
        if not hasattr(self, "_dtypes"):
            st = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
            self._dtypes = {}
            for f in sorted(Path(self.base_checkpoint).glob("*.safetensors")):
                header, _ = fmt.read_header(f)
                self._dtypes.update(
                    {n: st[i["dtype"]] for n, i in header.items() if n != "__metadata__" and i["dtype"] in st}
                )
        return self._dtypes

    # ------------------------------------------------------------------ sync
    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        """`lora` (full versions only): `state` is a LoRA adapter the engines merge (`slime.engine.lora_weights`)."""
        if lora is not None and (self.mode != "full" or self.local_dir):
            raise SlimeError("a LoRA adapter alone goes only in full disk versions loaded as they are")
        t0 = time.perf_counter()
        if not self.started:
            self._start(engine_urls)
        refused = 0
        if self.mode == "delta":
            vdir, nbytes, changed = self.write_delta(state)
            t_write = time.perf_counter() - t0
            self._published(vdir, engine_urls)
            failed = self._load(engine_urls, weight_version)
            for url, e in failed.items():
                if not (isinstance(e, HTTPRequestError) and e.status == 409):
                    raise SlimeError(f"delta weight sync to {url} failed: {e}")
            if failed:  # checksum refused: a full version for every engine (the chain restarts from it)
                refused = len(failed)
                self.refused += refused
                logger.warning(
                    "%d engine(s) refused delta %s (checksum mismatch): sending a full version", refused, vdir.name
                )
                for url, e in failed.items():
                    logger.warning("  %s: %s", url, e)
                vdir, full_bytes, _ = (*self.write_full(state), 0)
                nbytes += full_bytes
                self._published(vdir, engine_urls)
                self._raise_failures(self._load(engine_urls, weight_version), "full (after a refused delta)")
            self._prune()
        else:
            vdir, nbytes = self.write_full(state)
            changed = -1
            t_write = time.perf_counter() - t0
            self._published(vdir, engine_urls)
            self._raise_failures(self._load(engine_urls, weight_version, lora), "full")
            if not self.keep_files:
                shutil.rmtree(vdir, ignore_errors=True)
        self.last = {
            "perf/weight_sync_bytes": float(nbytes),
            "perf/weight_sync_write_time": t_write,
            "perf/weight_sync_delta_refused": float(refused),
        }
        if changed >= 0:
            self.last["perf/weight_sync_tensors_changed"] = float(changed)
        return self.last

    def _published(self, vdir: Path, engine_urls: list[str]) -> None:
        if self.post_write is not None:
            self.post_write(str(vdir), list(engine_urls))

    def _load(self, engine_urls: list[str], weight_version: str, lora: dict | None = None) -> dict[str, Exception]:
        """Every engine loads version self.version; {url: error} of those that failed."""
        vdir = fmt.version_dir(self.disk_dir, self.version)

        def one(c):
            if self.local_dir:
                c._call("POST", "/pull_weights", self._pull_body(self.version))
                return c.update_weights_from_disk(str(self.local_dir), weight_version=weight_version)
            return c.update_weights_from_disk(str(vdir), weight_version=weight_version, lora=lora)

        results = self._each(engine_urls, one)
        return {u: r for u, r in zip(engine_urls, results, strict=True) if isinstance(r, Exception)}

    @staticmethod
    def _raise_failures(failed: dict[str, Exception], what: str) -> None:
        if failed:
            url, e = next(iter(failed.items()))
            raise SlimeError(f"{what} disk weight sync to {url} failed: {e}")

    def _prune(self) -> None:
        """Delta mode: versions before the newest full one are no longer needed by anyone."""
        if self.keep_files:
            return
        versions = sorted(
            int(p.name[8:]) for p in self.disk_dir.glob("weight_v*") if re.fullmatch(r"weight_v\d{6}", p.name)
        )
        fulls = [v for v in versions if not fmt.is_delta(fmt.version_dir(self.disk_dir, v))]
        if fulls:
            for v in versions:
                if v < fulls[-1]:
                    shutil.rmtree(fmt.version_dir(self.disk_dir, v), ignore_errors=True)


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())
