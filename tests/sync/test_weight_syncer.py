"""The trainer's weight syncer: chosen once by transport, one interface for all of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slime.errors import SlimeError
from slime.sync.shm import SharedMemoryWeightSync
from slime.sync.syncer import (
    SYNCERS,
    CollectiveSyncer,
    DiskSyncer,
    IpcSyncer,
    SharedMemorySyncer,
    carries_adapters,
    make_syncer,
    select_syncer,
    transport_for,
)
from slime.utils.checkpoint_layout import weight_snapshot_version
from tests.helpers import make_args

CPU_STATE = {"w": torch.zeros(2)}
CUDA_STATE = {"w": SimpleNamespace(is_cuda=True)}  # only `is_cuda` is read to choose


@pytest.mark.parametrize(
    "argv, state, transport, cls",
    [
        (["--update-weight-transport", "disk", "--update-weight-disk-dir", "/tmp/w"], CPU_STATE, "disk", DiskSyncer),
        ([], CPU_STATE, "collective", CollectiveSyncer),  # nccl, not colocated
        (["--colocate"], CUDA_STATE, "ipc", IpcSyncer),
    ],
)
def test_transport_picks_its_syncer(argv, state, transport, cls):
    args = make_args(*argv)
    assert transport_for(args, state) == transport
    syncer = select_syncer(args, state)
    assert type(syncer) is cls and syncer.transport == transport
    syncer.reset()  # nothing set up yet: nothing to undo
    syncer.close()


@pytest.mark.skipif(not SharedMemoryWeightSync.available(), reason="no writable /dev/shm")
def test_colocated_on_the_cpu_with_the_builtin_engine_is_shared_memory():
    args = make_args("--colocate")
    assert transport_for(args, CPU_STATE) == "shm"
    syncer = select_syncer(args, CPU_STATE)
    assert isinstance(syncer, SharedMemorySyncer) and syncer.shm.path is None  # the buffer comes with the first sync
    syncer.close()


def test_every_transport_has_a_syncer():
    assert set(SYNCERS) == {"disk", "shm", "ipc", "collective"}


def test_an_unknown_transport_is_refused_naming_the_option():
    args = make_args()
    with pytest.raises(SlimeError, match=r"transport 'carrier-pigeon' is unknown \(--update-weight-transport 'nccl'\)"):
        make_syncer("carrier-pigeon", args)
    args.update_weight_transport = "tensor"  # past the parser's check
    with pytest.raises(SlimeError, match="--update-weight-transport 'tensor' has no weight syncer"):
        select_syncer(args, CPU_STATE)


def test_fault_tolerance_snapshots_what_was_synced(tmp_path):
    args = make_args("--use-fault-tolerance", "--run-dir", str(tmp_path))
    pushed = []

    class Recording(CollectiveSyncer):
        def push(self, engine_urls, state, weight_version):
            pushed.append((engine_urls, weight_version))
            return {"perf/x": 1.0}

    assert Recording(args).sync(["http://e:1"], CPU_STATE, "7") == {"perf/x": 1.0}
    assert pushed == [(["http://e:1"], "7")] and weight_snapshot_version(tmp_path) == "7"


@pytest.mark.skipif(not SharedMemoryWeightSync.available(), reason="no writable /dev/shm")
def test_a_runs_buffers_are_removed_once_their_writers_are_gone():
    """What a run does when it ends (`slime.train._release`): its buffers whose writer died (a rank
    killed before it could close) are removed; a live writer's buffer (another run's) is left."""
    import os
    import subprocess
    import uuid

    from slime.sync.shm import SHM_DIR, SHM_PREFIX, buffers, remove_stale_buffers

    child = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    live_name = f"{SHM_PREFIX}{child.pid}-{uuid.uuid4().hex[:12]}"
    dead_name = f"{SHM_PREFIX}{gone.pid}-{uuid.uuid4().hex[:12]}"
    try:
        for name in (live_name, dead_name):
            open(os.path.join(SHM_DIR, name), "wb").close()
        assert {live_name, dead_name} <= buffers()
        remove_stale_buffers({live_name, dead_name}, wait_s=0.3)  # the live writer does not exit in time
        assert live_name in buffers() and dead_name not in buffers()
        child.kill()
        child.wait()
        remove_stale_buffers({live_name}, wait_s=5)
        assert live_name not in buffers()
    finally:
        child.kill()
        for name in (live_name, dead_name):
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))


def test_an_adapter_goes_only_where_the_transport_carries_one_and_the_snapshot_is_the_merge(tmp_path):
    disk = ["--update-weight-transport", "disk", "--update-weight-disk-dir", str(tmp_path)]
    local = ["--update-weight-local-checkpoint-dir", str(tmp_path / "local")]
    assert carries_adapters(make_args(), "shm") and carries_adapters(make_args(), "collective")
    assert carries_adapters(make_args(*disk), "disk") and not carries_adapters(make_args(), "ipc")
    assert not carries_adapters(make_args(*disk, *local), "disk")  # /pull_weights copies a whole checkpoint
    delta = make_args(*disk, *local, "--update-weight-mode", "delta")
    assert not carries_adapters(delta, "disk")
    with pytest.raises(SlimeError, match="this disk weight sync moves whole weights, not a LoRA adapter"):
        make_syncer("disk", delta).sync(["http://e:1"], CPU_STATE, "1", lora={"base": False})
    args = make_args("--use-fault-tolerance", "--run-dir", str(tmp_path))
    pushed = []

    class Recording(CollectiveSyncer):
        def push(self, engine_urls, state, weight_version, lora=None):
            pushed.append((sorted(state), lora))
            return {}

    merged = {"w": torch.ones(2)}
    Recording(args).sync(
        ["http://e:1"], {"w.lora_A.weight": torch.zeros(1)}, "3", lora={"base": False}, snapshot=merged
    )
    assert pushed == [(["w.lora_A.weight"], {"base": False})] and weight_snapshot_version(tmp_path) == "3"
    from safetensors.torch import load_file

    (snap,) = list(tmp_path.rglob("*.safetensors"))
    assert torch.equal(load_file(str(snap))["w"], merged["w"])
