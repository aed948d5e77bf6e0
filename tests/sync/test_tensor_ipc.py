"""The IPC handle path of colocated weight sync (`slime.utils.tensor_ipc`, `slime.sync.ipc`), on the
CPU with shared-memory tensors: the same torch reductions and the same restricted decoder that
carry CUDA IPC handles on a GPU (there `scripts/gpu_check.sh` runs it)."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from slime.utils import tensor_ipc

RECEIVER = textwrap.dedent("""
    import base64, sys, torch
    from slime.utils import tensor_ipc
    named = tensor_ipc.loads(base64.b64decode(sys.stdin.read()))
    for name in sorted(named):
        t = named[name]
        print(name, t.dtype, tuple(t.shape), repr(float(t.double().sum())))
    named["w"].add_(1.0)  # mapped, not copied: the sender sees this
""")


def test_a_tensor_reaches_another_process_by_shared_memory():
    named = {
        "w": torch.arange(12, dtype=torch.float32).view(3, 4),
        "b": torch.randn(5, dtype=torch.bfloat16),
        "t": torch.randn(4, 6)[1:, ::2],
    }  # a strided view travels as its own storage and offset
    shared = tensor_ipc.shareable(named)
    assert all(t.is_shared() for t in shared.values())
    assert not named["w"].is_shared()  # the sender's own tensor is never moved into shared memory
    payload = base64.b64encode(tensor_ipc.dumps(shared)).decode()
    out = subprocess.run(
        [sys.executable, "-c", RECEIVER],
        input=payload,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    want = [f"{n} {named[n].dtype} {tuple(named[n].shape)} {float(named[n].double().sum())!r}" for n in sorted(named)]
    assert out.stdout.splitlines() == want
    assert torch.equal(shared["w"], named["w"] + 1.0)  # the receiver wrote into the same memory
    assert torch.equal(named["w"], torch.arange(12, dtype=torch.float32).view(3, 4))


def test_the_decoder_names_nothing_but_torch_rebuilds():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    with pytest.raises(tensor_ipc.IPCDecodeError, match="not allowed"):
        tensor_ipc.loads(pickle.dumps([("w", Evil())]))
    with pytest.raises(tensor_ipc.IPCDecodeError, match="list of \\(name, tensor\\) pairs"):
        tensor_ipc.loads(pickle.dumps({"w": 1}))
    with pytest.raises(tensor_ipc.IPCDecodeError, match="not a tensor IPC payload"):
        tensor_ipc.loads(b"garbage")


def test_only_cpu_and_cuda_tensors_are_shared():
    with pytest.raises(ValueError, match="only cpu and cuda"):
        tensor_ipc.shareable({"w": torch.empty(2, device="meta")})


class _StorageHandle:
    """Pickles as torch's own rebuild of a shared CPU storage, with the socket and name given."""

    def __init__(self, manager: bytes, handle: bytes):
        self.manager, self.handle = manager, handle

    def __reduce__(self):
        from torch.multiprocessing.reductions import rebuild_storage_filename

        return rebuild_storage_filename, (torch.UntypedStorage, self.manager, self.handle, 12)


@pytest.mark.parametrize(
    ("socket_dir", "handle"),
    [
        ("elsewhere", b"/torch_1_2_3"),  # a socket the client chose
        ("torch-shm-dir-abc", b"/../../etc/passwd"),  # a torch-like socket, a name that is no segment
        ("torch-shm-dir-abc/../x", b"/torch_1_2_3"),  # a path that walks out
    ],
)
def test_a_payload_naming_its_own_socket_or_segment_is_refused_without_connecting(tmp_path, socket_dir, handle):
    """`torch_ipc` payloads may name only a torch shared-memory segment and a torch manager socket
    of this user: the server never connects to a socket, or opens a name, that a client chose."""
    import socket

    sock_dir = tmp_path / socket_dir
    sock_dir.mkdir(parents=True, exist_ok=True)
    path = os.path.join(str(tmp_path), socket_dir, "manager.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.normpath(path))
    listener.listen(1)
    listener.settimeout(0.3)
    try:
        payload = pickle.dumps([("w", _StorageHandle(os.fsencode(path), handle))])
        with pytest.raises(tensor_ipc.IPCDecodeError):
            tensor_ipc.loads(payload)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
