"""Delta weight sync's format (slime's): encodings and checksums against independent references,
the local-checkpoint chain (full reset, in-order deltas, refusal of a wrong base), and slime's
option rules for the weight-sync options."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch
import xxhash
from safetensors.torch import load_file, save_file

from slime.arguments import parse_args
from slime.engine import weight_delta as fmt
from slime.errors import SlimeError

BASE = ["--hf-checkpoint", "/tmp/none", "--rollout-batch-size", "2", "--num-rollout", "1"]


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_encode_apply_roundtrip_against_reference(encoding):
    rng = np.random.default_rng(0)
    old = rng.integers(0, 256, 4096, dtype=np.uint8)
    new = old.copy()
    idx = rng.choice(4096, 100, replace=False)
    new[idx] = rng.integers(0, 256, 100, dtype=np.uint8)
    raw = fmt.encode(encoding, new, old)
    if encoding == "xor":  # reference: bytewise XOR, computed here in Python
        assert raw == bytes(a ^ b for a, b in zip(new.tolist(), old.tolist(), strict=True))
    else:  # reference: u4 count, u4 positions of the changed bytes, their new values
        changed = [i for i in range(4096) if new[i] != old[i]]
        want = (
            len(changed).to_bytes(4, "little")
            + b"".join(i.to_bytes(4, "little") for i in changed)
            + bytes(int(new[i]) for i in changed)
        )
        assert raw == want
    region = old.copy()
    fmt.apply(encoding, region, fmt.decompress(fmt.compress(raw)))
    assert np.array_equal(region, new)
    assert fmt.encode(encoding, old, old) is None  # nothing changed: nothing written


def test_checksums_match_the_libraries():
    data = bytes(range(256)) * 10
    assert fmt.checksum("xxh3-128", data) == xxhash.xxh3_128(data).hexdigest()
    assert fmt.checksum("adler32", data) == f"{zlib.adler32(data):08x}"


def _publish_delta(source, version, base_version, local_tensors, new_tensors, encoding="xor", corrupt=False):
    vdir = fmt.version_dir(source, version)
    vdir.mkdir(parents=True)
    arrays, digests = {}, {}
    for n, t in new_tensors.items():
        a, b = t.view(-1).view(torch.uint8).numpy(), local_tensors[n].view(-1).view(torch.uint8).numpy()
        raw = fmt.encode(encoding, a, b)
        if raw is None:
            continue
        arrays[n] = torch.frombuffer(bytearray(fmt.compress(raw)), dtype=torch.uint8)
        digests[n] = fmt.checksum("xxh3-128", a) if not corrupt else "0" * 32
    save_file(arrays, str(vdir / "model-00001.safetensors"), metadata=digests)
    (vdir / fmt.INDEX).write_text(
        json.dumps(
            {
                "metadata": {
                    "version": version,
                    "base_version": base_version,
                    "delta_encoding": encoding,
                    "checksum_format": "xxh3-128",
                    "compression_format": "zstd",
                },
                "weight_map": dict.fromkeys(arrays, "model-00001.safetensors"),
            }
        )
    )


def test_pull_chain_reset_apply_and_refusals(tmp_path):
    base, source, local = tmp_path / "base", tmp_path / "pub", tmp_path / "local"
    base.mkdir()
    w0 = {"a": torch.randn(8, 4), "b": torch.randn(5)}
    save_file(w0, str(base / "model.safetensors"))
    assert fmt.pull(local, base, source, 0)["reset_from"] == str(base)
    w1 = {"a": w0["a"] + 1e-3, "b": w0["b"].clone()}
    w1["b"][0] += 1
    _publish_delta(source, 1, 0, w0, w1, encoding="overwrite")
    assert fmt.pull(local, base, source, 1)["deltas"] == 1
    got = load_file(str(local / "model.safetensors"))
    assert all(torch.equal(got[n], w1[n]) for n in w1)
    assert fmt.applied_version(local) == 1
    # a delta built on the wrong base is refused before anything is written
    _publish_delta(source, 3, 1, w1, {"a": w1["a"] + 1})
    with pytest.raises(fmt.DeltaError, match="weight_v000002 has no model.safetensors.index.json"):
        fmt.pull(local, base, source, 3)
    # a checksum that does not match: refused, and the local checkpoint is marked unusable
    w2 = {"a": w1["a"] * 2, "b": w1["b"]}
    _publish_delta(source, 2, 1, w1, w2, corrupt=True)
    with pytest.raises(fmt.DeltaChecksumError, match="checksum mismatch"):
        fmt.pull(local, base, source, 2)
    assert fmt.applied_version(local) is None


def test_weight_sync_options_follow_slimes_rules(tmp_path):
    a = parse_args(BASE)
    assert (
        a.update_weight_mode,
        a.update_weight_transport,
        a.update_weight_delta_encoding,
        a.update_weight_delta_checksum,
        a.update_weight_buffer_size,
    ) == ("full", "nccl", "xor", "xxh3-128", 512 * 1024**2)
    disk = ["--update-weight-transport", "disk", "--update-weight-disk-dir", str(tmp_path / "d")]
    delta = ["--update-weight-mode", "delta", *disk, "--update-weight-local-checkpoint-dir", str(tmp_path / "l")]
    assert parse_args(BASE + delta).update_weight_mode == "delta"
    for extra, msg in [
        (["--update-weight-transport", "disk"], "requires --update-weight-disk-dir"),
        (["--update-weight-mode", "delta"], "delta requires --update-weight-transport=disk"),
        (["--update-weight-mode", "delta", *disk], "requires --update-weight-local-checkpoint-dir"),
        ([*delta, "--colocate"], "not supported with --colocate"),
        (["--update-weight-transport", "tensor"], "tensor .* is gone"),
        (["--update-weight-delta-encoding", "zip"], "xor or overwrite"),
        (["--rollout-external-engine-addrs", "nohost"], "'nohost' is not an engine address"),
        (["--rollout-external-engine-addrs", "127.0.0.1:1", "--colocate"], "drop --colocate"),
    ]:
        with pytest.raises(SlimeError, match=msg):
            parse_args(BASE + extra)
    ext = parse_args(BASE + ["--rollout-external-engine-addrs", "127.0.0.1:5000", "http://[::1]:5001/"])
    assert ext.rollout_external_engine_addrs == ["http://127.0.0.1:5000", "http://[::1]:5001"]
    assert ext.engine_api_key is None  # external engines keep their own keys


def test_unreachable_external_engine_is_named():
    from slime.sync.external import discover
    from slime.utils.net import free_port

    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    with pytest.raises(SlimeError, match=f"the engine at {url} does not answer"):
        discover([url], timeout=2.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_transposing_weight_copy_is_exact(threads):
    """The engine's load into column-major linears (C kernel) gives exactly torch's copy_."""
    from slime.engine import weight_copy

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in [(1536, 512), (37, 4099), (129, 65), (8, 8)]:
            src = torch.randn(*shape)
            dst = torch.empty(shape[1], shape[0]).t()  # the engine's layout: W.T contiguous
            weight_copy.copy_into(dst, src)
            assert torch.equal(dst, src), shape
        import shutil

        if shutil.which("gcc"):  # without a compiler the same copy is torch's (also checked above)
            assert weight_copy._load() is not None
    finally:
        torch.set_num_threads(old)


def test_shared_memory_buffer_layout_and_cleanup():
    """The trainer's /dev/shm buffer: every tensor 64-byte aligned at its offset, bytes exact; a
    buffer left by a process that is gone is removed by the next allocation; close() unlinks."""
    import os
    import subprocess

    from slime.sync.shm import SHM_DIR, SHM_PREFIX, SharedMemoryWeightSync

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(SHM_DIR, f"{SHM_PREFIX}{dead.pid}-abcdef012345")
    open(stale, "wb").close()
    state = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.float32).to(torch.bfloat16)}
    sync = SharedMemoryWeightSync()
    body = sync.write(state)
    try:
        assert not os.path.exists(stale)
        assert body["names"] == ["a", "b"] and body["offsets"] == [0, 64] and body["dtypes"] == ["float32", "bfloat16"]
        raw = open(body["path"], "rb").read()
        assert raw[:60] == state["a"].numpy().tobytes()
        assert raw[64:78] == state["b"].view(torch.int16).numpy().tobytes()
    finally:
        sync.close()
    assert not os.path.exists(body["path"])
