"""Disk weight sync's on-disk format and the engine's `/pull_weights` (slime's format and rules).

A trainer publishes each sync as a version directory `weight_v{N:06d}/` under
`--update-weight-disk-dir`, of one of two kinds, told apart by the metadata of its
`model.safetensors.index.json`:

* **full**: an ordinary HF checkpoint (no `delta_encoding` in the metadata);
* **delta**: safetensors files whose tensors are the zstd-compressed (level 1) byte deltas of
  the changed tensors (dtype U8), the index metadata naming `version`, `base_version`,
  `delta_encoding` (`xor`: new ^ old; `overwrite`: u4 count, u4 byte positions, new bytes),
  `checksum_format` (`xxh3-128`, `blake3`, `adler32`) and `compression_format` (`zstd`); each
  file's `__metadata__` maps a tensor name to the checksum of its new bytes.

`pull(local_dir, base_dir, source_dir, target)` brings a host-local full checkpoint up to
version `target`: version 0 is the engine's own model directory (`base_dir`), a full version is
copied as is, a delta is patched into the local files in place and every patched tensor is
checked against its checksum. A mismatch raises `DeltaChecksumError` and leaves the local
checkpoint marked unusable (the next pull starts again from a full version), so a wrong base or
a corrupt delta is never served. Deltas apply only on top of their declared base version.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

INDEX = "model.safetensors.index.json"
SYNC_DIR = ".slime_sync"  # in the local checkpoint: state.json {"version": N}
COMPRESSION = "zstd"
ZSTD_LEVEL = 1
WORKERS = max(1, min(4, os.cpu_count() or 1))
# whether a file (symlinks resolved) may be read: the server's allowed directories
FileCheck = Callable[[str], bool]


class DeltaError(RuntimeError):
    """A pull that could not bring the local checkpoint to the version asked for."""


class DeltaChecksumError(DeltaError):
    """A delta applied, but the result's checksum is not the trainer's: refused."""


def version_dir(source_dir: str | os.PathLike, version: int) -> Path:
    return Path(source_dir) / f"weight_v{version:06d}"


# ------------------------------------------------------------------------------ checksums
class _Adler32:
    def __init__(self):
        self._value = 1

    def update(self, data) -> None:
        self._value = zlib.adler32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def new_hasher(algorithm: str):
    if algorithm == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "blake3":
        import blake3

        return blake3.blake3()
    if algorithm == "adler32":
        return _Adler32()
    raise DeltaError(f"unknown checksum algorithm {algorithm!r}")


def checksum(algorithm: str, buf) -> str:
    h = new_hasher(algorithm)
    h.update(buf)
    return h.hexdigest()


# ------------------------------------------------------------------------------ encodings
def encode(encoding: str, new: np.ndarray, old: np.ndarray) -> bytes | None:
    """The delta of two equal-length uint8 arrays, uncompressed; None when nothing changed."""
    if new.shape != old.shape:
        raise DeltaError(f"delta of {new.size} bytes against a base of {old.size} bytes")
    if encoding == "xor":
        x = np.bitwise_xor(new, old)
        return x.tobytes() if x.any() else None
    if encoding == "overwrite":
        changed = np.flatnonzero(new != old).astype("<u4")
        if not changed.size:
            return None
        return np.array([changed.size], "<u4").tobytes() + changed.tobytes() + new[changed].tobytes()
    raise DeltaError(f"unknown delta encoding {encoding!r}")


def apply(encoding: str, region: np.ndarray, delta: bytes) -> None:
    """Patch `region` (uint8, writable) in place with an uncompressed delta."""
    if encoding == "xor":
        if len(delta) != region.size:
            raise DeltaError(f"xor delta of {len(delta)} bytes for a tensor of {region.size} bytes")
        np.bitwise_xor(region, np.frombuffer(delta, np.uint8), out=region)
    elif encoding == "overwrite":
        (count,) = struct.unpack_from("<I", delta, 0)
        if len(delta) != 4 + 5 * count:
            raise DeltaError(f"overwrite delta of {len(delta)} bytes does not hold {count} positions and values")
        pos = np.frombuffer(delta, "<u4", count, 4)
        if count and int(pos.max()) >= region.size:
            raise DeltaError(f"overwrite delta writes byte {int(pos.max())} of a tensor of {region.size} bytes")
        region[pos] = np.frombuffer(delta, np.uint8, count, 4 + 4 * count)
    else:
        raise DeltaError(f"unknown delta encoding {encoding!r}")


def compress(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)


def decompress(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data)


# ------------------------------------------------------------------------------ safetensors headers
def tensor_locations(ckpt_dir: str | os.PathLike) -> dict[str, tuple[str, int, int]]:
    """name -> (file, byte offset, byte length) from every safetensors header in `ckpt_dir`."""
    out: dict[str, tuple[str, int, int]] = {}
    for path in sorted(Path(ckpt_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = (str(path), 8 + n + begin, end - begin)
    return out


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def read_index_metadata(vdir: str | os.PathLike) -> dict:
    index = Path(vdir) / INDEX
    if not index.exists():
        raise DeltaError(f"{vdir} has no {INDEX} (not a published weight version)")
    return json.loads(index.read_text()).get("metadata", {})


def is_delta(vdir: str | os.PathLike) -> bool:
    return "delta_encoding" in read_index_metadata(vdir)


# ------------------------------------------------------------------------------ local checkpoint
def applied_version(local_dir: str | os.PathLike) -> int | None:
    try:
        return int(json.loads((Path(local_dir) / SYNC_DIR / "state.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def _set_applied(local_dir: str | os.PathLike, version: int | None) -> None:
    d = Path(local_dir) / SYNC_DIR
    d.mkdir(parents=True, exist_ok=True)
    if version is None:
        (d / "state.json").unlink(missing_ok=True)
        return
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps({"version": version}))
    os.replace(tmp, d / "state.json")


def _check_files(files: list[Path], file_ok: FileCheck | None) -> None:
    """Each file (symlinks resolved) passes `file_ok`, or nothing is read: a published version is a
    client's directory, and a symlink in it must not carry another file of this host in."""
    for f in files:
        if file_ok is not None and not file_ok(str(f)):
            raise DeltaError(f"{f.name!r} in {f.parent.name} leads outside the directories weights load from")


def reset(
    src_dir: str | os.PathLike, local_dir: str | os.PathLike, version: int, file_ok: FileCheck | None = None
) -> None:
    """Make `local_dir` hold exactly the checkpoint files of `src_dir` (a full version, or the
    engine's model directory for version 0); with `file_ok`, every file copied must pass it."""
    src, local = Path(src_dir), Path(local_dir)
    entries = [
        e
        for e in src.iterdir()
        if e.is_file() and (e.suffix in (".safetensors", ".json") or e.name.startswith("tokenizer"))
    ]
    _check_files(entries, file_ok)
    local.mkdir(parents=True, exist_ok=True)
    _set_applied(local, None)  # not usable until the copy is complete
    keep = set()
    for entry in entries:
        tmp = local / (entry.name + ".tmp")
        shutil.copyfile(entry, tmp)
        os.replace(tmp, local / entry.name)
        keep.add(entry.name)
    for entry in local.iterdir():  # files of an earlier checkpoint that this one does not have
        if entry.is_file() and entry.suffix == ".safetensors" and entry.name not in keep:
            entry.unlink()
    _set_applied(local, version)


def apply_version(local_dir: str | os.PathLike, vdir: str | os.PathLike, file_ok: FileCheck | None = None) -> int:
    """Patch one delta version into `local_dir` in place; returns how many tensors changed."""
    meta = read_index_metadata(vdir)
    version, base = int(meta["version"]), int(meta["base_version"])
    applied = applied_version(local_dir)
    if applied == version:
        return 0
    if applied != base:
        raise DeltaError(
            f"out-of-order delta: the local checkpoint is at version {applied}, "
            f"{Path(vdir).name} builds on version {base}"
        )
    if meta.get("compression_format") != COMPRESSION:
        raise DeltaError(f"{Path(vdir).name}: compression {meta.get('compression_format')!r} is not supported")
    encoding, algorithm = meta["delta_encoding"], meta["checksum_format"]
    locations = tensor_locations(local_dir)
    items = []
    delta_files = sorted(Path(vdir).glob("*.safetensors"))
    _check_files(delta_files, file_ok)
    for dfile in delta_files:
        header, data_start = read_header(dfile)
        want = header.get("__metadata__", {}) or {}
        blob = dfile.read_bytes()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name not in locations:
                raise DeltaError(f"{Path(vdir).name}: tensor {name!r} is not in the local checkpoint")
            b, e = info["data_offsets"]
            items.append((name, blob[data_start + b : data_start + e], want.get(name)))
    maps: dict[str, tuple] = {}
    mismatches: list[str] = []
    lock = threading.Lock()
    _set_applied(local_dir, None)  # half-patched files are never taken for a version
    try:
        for path in {locations[n][0] for n, _, _ in items}:
            fh = open(path, "r+b")
            maps[path] = (fh, mmap.mmap(fh.fileno(), 0))

        def one(item):
            name, compressed, want = item
            path, offset, nbytes = locations[name]
            region = np.ndarray((nbytes,), np.uint8, buffer=maps[path][1], offset=offset)
            apply(encoding, region, decompress(compressed))
            if want is None or checksum(algorithm, region) != want:
                with lock:
                    mismatches.append(name)

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(one, items))
        for _, mm in maps.values():
            mm.flush()
    finally:
        for fh, mm in maps.values():
            mm.close()
            fh.close()
    if mismatches:
        raise DeltaChecksumError(
            f"checksum mismatch ({algorithm}) after applying {Path(vdir).name} to "
            f"{sorted(mismatches)[:5]}{' ...' if len(mismatches) > 5 else ''}: refused; the "
            "local checkpoint needs a full version"
        )
    _set_applied(local_dir, version)
    return len(items)


def pull(
    local_dir: str | os.PathLike,
    base_dir: str | os.PathLike,
    source_dir: str | os.PathLike,
    target: int,
    file_ok: FileCheck | None = None,
) -> dict:
    """Bring `local_dir` to version `target` (see the module's doc); returns what was done. Engines
    on one host sharing `local_dir` take turns (a file lock): the first applies, the rest find it done."""
    if target < 0:
        raise DeltaError(f"target_version must be >= 0, got {target}")
    lock_dir = Path(local_dir) / SYNC_DIR
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _pull_locked(local_dir, base_dir, source_dir, target, file_ok)


def _pull_locked(local_dir, base_dir, source_dir, target: int, file_ok: FileCheck | None) -> dict:
    if target == 0:  # the engine's own weights: a fresh copy (a new run's chain starts here)
        if applied_version(local_dir) != 0:
            reset(base_dir, local_dir, 0)
        return {"version": 0, "reset_from": str(base_dir), "deltas": 0}
    applied = applied_version(local_dir)
    floor = applied if applied is not None else 0
    start = target
    while start > floor and is_delta(version_dir(source_dir, start)):
        start -= 1
    reset_from = None
    if applied is None or start > applied:
        seed = Path(base_dir) if start == 0 else version_dir(source_dir, start)
        reset(seed, local_dir, start, None if start == 0 else file_ok)  # --model-path: the operator's own
        reset_from = str(seed)
    elif applied > target:
        raise DeltaError(f"the local checkpoint is at version {applied}, past the target {target}")
    else:
        start = applied
    deltas = 0
    for v in range(start + 1, target + 1):
        vdir = version_dir(source_dir, v)
        if not vdir.exists():
            raise DeltaError(f"version {v} ({vdir}) was not published")
        apply_version(local_dir, vdir, file_ok)
        deltas += 1
    return {"version": target, "reset_from": reset_from, "deltas": deltas}
