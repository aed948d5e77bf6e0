"""Who may call the engine server and how much they may send, against a real server: keys (401),
admin-only endpoints, Host/Origin (403), content types (415), body caps (413), a full queue (503,
waited out by the rollout client), batch caps, disk loads outside the allowed directories (403;
an index entry or a symlink leading out: 400), /pull_weights never writing into the served model,
and a client that disconnects (its request is aborted)."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from engine_test_utils import run_async, start_engine

from slime.engine.client import EngineClient
from slime.utils import api_keys
from slime.utils.http_utils import HTTPRequestError, post

pytestmark = pytest.mark.timeout(120)

KEY, ADMIN = "gen-key-123", "admin-key-456"
AUTH, ADMIN_AUTH = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def allowed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights_ok")


@pytest.fixture(scope="module")
def engine(tiny_model_dir, allowed_dir, tmp_path_factory):
    eng = start_engine(
        tiny_model_dir,
        "--api-key",
        KEY,
        "--admin-api-key",
        ADMIN,
        "--step-delay-ms",
        "30",
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        "--max-request-body-mb",
        "0.05",
        "--max-batch-request-size",
        "2",
        "--weight-load-dirs",
        str(allowed_dir),
        log_dir=tmp_path_factory.mktemp("sec_log"),
    )
    yield eng
    eng.stop()


@pytest.fixture()
def h():
    with httpx.Client(timeout=30, trust_env=False) as c:
        yield c


def gen(n=2, ids=(1, 2, 3)):
    return {"input_ids": list(ids), "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def wait_load(engine, h, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = h.get(engine.url + "/get_load", headers=AUTH).json()
        if pred(load):
            return load
        time.sleep(0.02)
    raise AssertionError(f"load never matched: {load}")


def test_requests_without_the_key_get_401(engine, h):
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, ADMIN_AUTH):
        assert h.post(engine.url + "/generate", json=gen(), headers=headers).status_code == 401, headers
        assert h.get(engine.url + "/get_model_info", headers=headers).status_code == 401, headers
    assert h.get(engine.url + "/health").status_code == 200  # probes need no secret (SGLang's rule)
    out = h.post(engine.url + "/generate", json=gen(), headers=AUTH)
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2
    info = h.get(engine.url + "/get_server_info", headers=AUTH).json()
    assert "api_key" not in info and "admin_api_key" not in info and KEY not in str(info)


def test_weight_and_control_endpoints_need_the_admin_key(engine, h):
    for path, body in (
        ("/pause_generation", {"mode": "abort"}),
        ("/continue_generation", {}),
        ("/abort_request", {"abort_all": True}),
        ("/flush_cache", {}),
        ("/release_memory_occupation", {}),
        ("/update_weight_version", {"new_version": "x"}),
        (
            "/init_weights_update_group",
            {"master_address": "10.9.9.9", "master_port": 1, "world_size": 2, "rank_offset": 1},
        ),
        ("/update_weights_from_disk", {"model_path": "/"}),
    ):
        assert h.post(engine.url + path, json=body, headers=AUTH).status_code == 401, path
    assert h.post(engine.url + "/pause_generation", json={"mode": "abort"}, headers=ADMIN_AUTH).status_code == 200
    assert h.post(engine.url + "/continue_generation", headers=ADMIN_AUTH).status_code == 200
    with EngineClient(engine.url, timeout=30, api_key=KEY, admin_api_key=ADMIN) as c:  # picks the key per path
        assert c.flush_cache()["success"] and c.generate(gen())["meta_info"]["completion_tokens"] == 2


def test_cross_site_requests_are_refused(engine, h):
    evil = {"Origin": "http://evil.example", **AUTH}
    assert h.post(engine.url + "/generate", json=gen(), headers=evil).status_code == 403
    assert h.post(engine.url + "/generate", json=gen(), headers={"Origin": "null", **AUTH}).status_code == 403
    rebound = {"Host": f"evil.example:{engine.port}", **AUTH}
    assert h.post(engine.url + "/generate", json=gen(), headers=rebound).status_code == 403
    own = {"Origin": f"http://127.0.0.1:{engine.port}", **AUTH}
    assert h.post(engine.url + "/generate", json=gen(), headers=own).status_code == 200
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        resp = h.post(engine.url + "/generate", content=b'{"input_ids": [1]}', headers={"content-type": ctype, **AUTH})
        assert resp.status_code == 415, ctype
    assert (
        h.post(
            engine.url + "/pause_generation", content=b"", headers={"content-type": "text/plain", **ADMIN_AUTH}
        ).status_code
        == 415
    )
    assert h.get(engine.url + "/get_server_info", headers=AUTH).json()["paused"] is None


def test_oversized_bodies_get_413(engine, h):
    big = {"input_ids": [1] * 30000, "sampling_params": {"max_new_tokens": 1}}  # ~90 KB > 0.05 MB
    assert h.post(engine.url + "/generate", json=big, headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: the cap holds while reading
        for _ in range(20):
            yield b" " * 8192

    resp = h.post(engine.url + "/generate", content=chunks(), headers={"content-type": "application/json", **AUTH})
    assert resp.status_code == 413
    assert (
        h.post(
            engine.url + "/update_weights_from_tensor",
            json={"serialized_named_tensors": ["x" * 70000]},
            headers=ADMIN_AUTH,
        ).status_code
        == 400
    )  # the weight endpoint has a cap of its own (the model's)
    batch = {"input_ids": [[1], [2], [3]], "sampling_params": {"max_new_tokens": 1}}
    resp = h.post(engine.url + "/generate", json=batch, headers=AUTH)
    assert resp.status_code == 400 and "--max-batch-request-size" in resp.json()["error"]["message"]


def test_disk_loads_only_from_allowed_directories(engine, h, tiny_model_dir, allowed_dir, tmp_path):
    for path in ("/etc", str(tmp_path), str(allowed_dir) + "/../x"):
        resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": path}, headers=ADMIN_AUTH)
        assert resp.status_code == 403, path
    resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": str(allowed_dir)}, headers=ADMIN_AUTH)
    assert resp.status_code == 400  # allowed, but holds no weights
    resp = h.post(
        engine.url + "/update_weights_from_disk", json={"model_path": str(tiny_model_dir)}, headers=ADMIN_AUTH
    )
    assert resp.status_code == 200, resp.text


def test_an_index_or_a_symlink_cannot_lead_a_disk_load_out_of_the_allowed_directories(
    engine, h, tiny_model_dir, allowed_dir, tmp_path
):
    """Every file a load reads, by an index entry or through a symlink, stays inside the allowed
    directories; the answer is the same whether the file outside exists or not."""
    import json
    import os
    import shutil

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(tiny_model_dir / "model.safetensors", outside / "model.safetensors")  # a real weights file
    answers = []
    for name, target in (
        ("by-index", os.path.relpath(outside / "model.safetensors", allowed_dir / "by-index")),
        ("by-index-missing", os.path.relpath(outside / "nothing.safetensors", allowed_dir / "by-index-missing")),
        ("by-absolute-index", str(outside / "model.safetensors")),
    ):
        d = allowed_dir / name
        d.mkdir()
        index = {"metadata": {}, "weight_map": {"model.norm.weight": target}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": str(d)}, headers=ADMIN_AUTH)
        assert resp.status_code == 400 and "not a file inside the directory" in resp.text, (name, resp.text)
        answers.append(resp.json()["message"].replace(target, "T"))
    assert answers[0] == answers[1]  # nothing tells whether the file outside exists
    linked = allowed_dir / "by-symlink"
    linked.mkdir()
    os.symlink(outside / "model.safetensors", linked / "model.safetensors")
    resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": str(linked)}, headers=ADMIN_AUTH)
    assert resp.status_code == 400 and "leads outside the directories weights load from" in resp.text, resp.text


def test_pull_weights_never_writes_into_the_served_model(tiny_model_dir, tmp_path):
    """/pull_weights writes its local checkpoint: --model-path, a directory holding it or one inside
    it is refused as that target even inside --weight-load-dirs, and the model's files are untouched;
    a directory of its own beside the model is accepted."""
    import shutil

    root = tmp_path / "weights"
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)
    eng = start_engine(model, "--weight-load-dirs", str(root), log_dir=tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    try:
        with httpx.Client(timeout=30, trust_env=False) as h:

            def pull(local):
                body = {"local_checkpoint_dir": str(local), "source_dir": str(root), "target_version": 0}
                return h.post(eng.url + "/pull_weights", json=body)

            for local in (model, model / "sub", root):
                resp = pull(local)
                assert resp.status_code == 403 and "overlaps the served model's directory" in resp.text, (
                    local,
                    resp.text,
                )
            assert {p.name: p.stat().st_mtime_ns for p in model.iterdir()} == before
            resp = pull(root / "local")
            assert resp.status_code == 200, resp.text
            assert (root / "local" / "model.safetensors").exists()
    finally:
        eng.stop()


def test_full_queue_gets_503_and_the_rollout_client_waits_it_out(engine, h):
    url = engine.url + "/generate"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(h.post, url, json=gen(200), headers=AUTH)
        wait_load(engine, h, lambda load: load["num_running_reqs"] == 1)
        waiting = pool.submit(h.post, url, json=gen(1, (4, 5)), headers=AUTH)
        wait_load(engine, h, lambda load: load["num_waiting_reqs"] == 1)
        full = h.post(url, json=gen(1), headers=AUTH)
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        # the rollout client waits (without using up its attempts) until there is room
        api_keys.register([engine.url], KEY, ADMIN)
        later = pool.submit(run_async, post(url, gen(1, (6, 7)), max_retries=1))
        time.sleep(0.5)
        assert not later.done()
        h.post(engine.url + "/abort_request", json={"abort_all": True}, headers=ADMIN_AUTH)
        assert running.result().json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert waiting.result().status_code == 200
        assert later.result(timeout=30)["meta_info"]["completion_tokens"] == 1


def test_a_disconnected_clients_request_is_aborted(engine, h):
    with httpx.Client(timeout=httpx.Timeout(1.0, connect=5.0), trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):  # 200 steps x 30 ms: far longer than it waits
            impatient.post(engine.url + "/generate", json=gen(200), headers=AUTH)
    # the client's connection is gone: the engine stops generating for it
    wait_load(engine, h, lambda load: load["num_reqs"] == 0, timeout=3.0)
    out = h.post(engine.url + "/generate", json=gen(2), headers=AUTH)
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2


def test_client_without_registered_key_is_refused(engine):
    with EngineClient(engine.url.replace("127.0.0.1", "localhost"), timeout=30) as c:  # an address not registered
        with pytest.raises(HTTPRequestError) as e:
            c.get_model_info()
    assert e.value.status == 401
