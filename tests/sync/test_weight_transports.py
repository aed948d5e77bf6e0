"""Weight transports against a real engine server process: shared memory (colocated full sync),
disk full and disk delta (`/pull_weights` + `/update_weights_from_disk`), delta = full bit for bit,
and a delta whose checksum does not match refused with a full sync following (counted)."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from slime.engine.client import EngineClient
from slime.sync.tensor import engine_sequence_log_probs
from slime.utils.http_utils import HTTPRequestError
from tests.engine.engine_test_utils import start_engine

pytestmark = [pytest.mark.timeout(300)]

SEQ = list(range(5, 40))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("wsync")
    return {"root": root, "pub": root / "pub", "local": root / "local", "full": root / "full"}


@pytest.fixture(scope="module")
def engine(tiny_model_dir, dirs):
    eng = start_engine(str(tiny_model_dir), "--weight-load-dirs", str(dirs["root"]))
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture
def trained(hf_model):
    """A copy of the tiny model moved by `steps()` real AdamW steps at a small learning rate."""
    import copy

    m = copy.deepcopy(hf_model).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.tensor([SEQ[:20], SEQ[10:30]])

    def step():
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        return {k: v.detach() for k, v in m.state_dict().items()}

    return m, step


def engine_logprobs(url: str) -> list[float]:
    return engine_sequence_log_probs(url, SEQ)


def reference_logprobs(model) -> torch.Tensor:
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor([SEQ])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(SEQ[1:])[:, None])[:, 0]


def test_shared_memory_full_sync(engine, trained):
    from slime.sync.shm import SHM_DIR, SharedMemoryWeightSync

    model, step = trained
    state = step()
    sync = SharedMemoryWeightSync()
    try:
        assert sync.push([engine.url], state, weight_version="shm1") > 0
        assert sync.path.startswith(SHM_DIR + "/")
        assert EngineClient(engine.url).get_weight_version() == "shm1"
        got = torch.tensor(engine_logprobs(engine.url))
        assert (got - reference_logprobs(model)).abs().max() < 1e-4
        # the second sync reuses the same buffer (the engine keeps its mapping)
        path = sync.path
        state = step()
        sync.push([engine.url], state, weight_version="shm2")
        assert sync.path == path
        assert (torch.tensor(engine_logprobs(engine.url)) - reference_logprobs(model)).abs().max() < 1e-4
    finally:
        sync.close()
    assert not os.path.exists(path)


def test_shared_memory_bad_path_refused(engine):
    with pytest.raises(HTTPRequestError, match="path must be a file /dev/shm/slime-weights-"):
        EngineClient(engine.url)._call(
            "POST",
            "/update_weights_from_shared_memory",
            {
                "path": "/etc/passwd",
                "size": 8,
                "names": ["model.norm.weight"],
                "dtypes": ["float32"],
                "shapes": [[2]],
                "offsets": [0],
            },
        )


def test_pull_outside_weight_load_dirs_refused(engine, tmp_path):
    with pytest.raises(HTTPRequestError, match="HTTP 403"):
        EngineClient(engine.url)._call(
            "POST",
            "/pull_weights",
            {"local_checkpoint_dir": str(tmp_path), "source_dir": str(tmp_path), "target_version": 0},
        )


def test_delta_equals_full_bit_for_bit_and_refused_delta_falls_back(engine, tiny_model_dir, dirs, trained):
    from slime.sync.disk import DiskWeightSync

    model, step = trained
    delta = DiskWeightSync(
        disk_dir=str(dirs["pub"]), mode="delta", local_dir=str(dirs["local"]), base_checkpoint=str(tiny_model_dir)
    )
    seen = []  # --custom-update-weight-post-write-path: after the files are written, before engines read

    def post_write(version_dir, engines):
        seen.append(
            (
                os.path.basename(version_dir),
                os.path.exists(os.path.join(version_dir, "model.safetensors.index.json")),
                engines,
            )
        )

    full = DiskWeightSync(
        disk_dir=str(dirs["full"]), mode="full", base_checkpoint=str(tiny_model_dir), post_write=post_write
    )
    full_bytes = None
    for i in range(2):
        state = step()
        m = delta.push([engine.url], state, weight_version=f"delta{i}")
        assert m["perf/weight_sync_delta_refused"] == 0
        assert EngineClient(engine.url).get_weight_version() == f"delta{i}"
        after_delta = engine_logprobs(engine.url)
        # the engine's local checkpoint holds exactly the trainer's weights
        local = load_file(str(dirs["local"] / "model.safetensors"))
        for name, t in local.items():
            assert torch.equal(t, state[name].to(t.dtype)), name
        f = full.push([engine.url], state, weight_version=f"full{i}")
        full_bytes = f["perf/weight_sync_bytes"]
        assert engine_logprobs(engine.url) == after_delta  # bit-identical weights: identical floats
    assert (torch.tensor(after_delta) - reference_logprobs(model)).abs().max() < 1e-4
    assert m["perf/weight_sync_bytes"] < full_bytes
    assert seen == [("weight_v000001", True, [engine.url]), ("weight_v000002", True, [engine.url])]
    assert not list(dirs["full"].glob("weight_v*"))  # full versions removed once loaded (no --keep-files)

    # A corrupted local checkpoint (a wrong base): the delta's checksums cannot match; the engine
    # refuses it (409), a full version follows in the same sync and the refusal is counted.
    path = dirs["local"] / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    state = step()
    m = delta.push([engine.url], state, weight_version="after-refusal")
    assert m["perf/weight_sync_delta_refused"] == 1 and delta.refused == 1
    local = load_file(str(path))
    for name, t in local.items():
        assert torch.equal(t, state[name].to(t.dtype)), name
    assert (torch.tensor(engine_logprobs(engine.url)) - reference_logprobs(model)).abs().max() < 1e-4
    # the chain goes on from the full version
    state = step()
    m = delta.push([engine.url], state, weight_version="next")
    assert m["perf/weight_sync_delta_refused"] == 0
    assert sorted(p.name for p in dirs["pub"].iterdir()) == ["weight_v000004", "weight_v000005"]  # older pruned


def test_a_lora_adapter_alone_in_full_disk_versions(engine, tiny_model_dir, dirs, hf_model):
    """A LoRA run's full disk versions hold the adapter (and the base, the first time); the engine
    merges it and then serves the weights of the trainer's merge, bit for bit."""
    import copy
    from argparse import Namespace

    from slime.backends.torch import lora
    from slime.sync.disk import DiskWeightSync

    m = copy.deepcopy(hf_model)
    opts = dict(lora_rank=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["all-linear"])
    lora.apply(m, Namespace(**opts, lora_exclude_modules=[], lora_adapter_path=None, seed=1, bf16=False, fp16=False))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05)
    raw = {k: v.detach() for k, v in m.state_dict().items()}
    field = {"scaling": lora.scaling(m), "base_id": "disk-run", "modules": lora.adapted_modules(m)}
    sync = DiskWeightSync(disk_dir=str(dirs["root"] / "lora"), mode="full", base_checkpoint=str(tiny_model_dir))
    sync.push([engine.url], lora.merged(raw, lora.scaling(m)), weight_version="merged")
    want = engine_logprobs(engine.url)
    first = sync.push(
        [engine.url],
        {**lora.base_view(raw), **lora.engine_adapter(raw)},
        weight_version="l1",
        lora={**field, "base": True},
    )
    assert engine_logprobs(engine.url) == want
    again = sync.push([engine.url], lora.engine_adapter(raw), weight_version="l2", lora={**field, "base": False})
    assert engine_logprobs(engine.url) == want and EngineClient(engine.url).get_weight_version() == "l2"
    assert again["perf/weight_sync_bytes"] < first["perf/weight_sync_bytes"] / 3
    assert (torch.tensor(want) - reference_logprobs(m)).abs().max() < 1e-4  # the LoRA model's own
