"""--router-policy, --rollout-backend, SGLang command construction and argument validation,
router command lines, and the session routing-key header (no server processes)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import sys
import types

import pytest

from slime.arguments import engine as engine_args
from slime.arguments import parse_args, startup_notes
from slime.engine.args import check_engine_args
from slime.errors import SlimeError
from slime.ray.engine_launch import sglang_installed, sglang_server_command, validate_sglang_args
from slime.ray.router import dispatcher_command, sglang_router_command

BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "3"]
SGLANG = BASE + ["--rollout-backend", "sglang"]


def test_router_policy_argument():
    assert parse_args(BASE).router_policy == "cache_aware"  # slime's (sglang-router's) default
    assert parse_args(BASE + ["--router-policy", "consistent_hashing"]).router_policy == "consistent_hashing"
    with pytest.raises(SlimeError, match="--router-policy.*did you mean 'consistent_hashing'"):
        parse_args(BASE + ["--router-policy", "consistent_hash"])


def test_rollout_backend_default_and_choice(monkeypatch):
    assert parse_args(BASE).rollout_backend == "builtin"  # no CUDA, no sglang here
    assert parse_args(BASE + ["--rollout-backend", "sglang"]).rollout_backend == "sglang"
    with pytest.raises(SlimeError, match="--rollout-backend"):
        parse_args(BASE + ["--rollout-backend", "vllm"])
    monkeypatch.setattr(engine_args, "sglang_installed", lambda: True)
    monkeypatch.setattr(engine_args, "cuda_available", lambda: False)
    assert parse_args(BASE).rollout_backend == "builtin"
    monkeypatch.setattr(engine_args, "cuda_available", lambda: True)
    assert parse_args(BASE).rollout_backend == "sglang"
    monkeypatch.setattr(engine_args, "sglang_installed", lambda: False)
    assert parse_args(BASE).rollout_backend == "builtin"


def test_weight_update_transport_is_slimes():
    """slime's nccl is the default with either backend; the earlier slime-rl 'tensor' is refused,
    naming what replaced it."""
    assert parse_args(BASE).update_weight_transport == "nccl"
    assert parse_args(BASE + ["--rollout-backend", "sglang"]).update_weight_transport == "nccl"
    with pytest.raises(SlimeError, match="--update-weight-transport tensor.*is gone"):
        parse_args(BASE + ["--rollout-backend", "sglang", "--update-weight-transport", "tensor"])


def test_update_weight_mode_has_slimes_meaning():
    """slime's --update-weight-mode is the payload (full/delta), not the transport; the earlier
    slime-rl spelling is pointed at --update-weight-transport."""
    assert parse_args(BASE).update_weight_mode == "full"
    with pytest.raises(SlimeError, match="--update-weight-transport nccl"):
        parse_args(BASE + ["--update-weight-mode", "distributed"])
    with pytest.raises(SlimeError, match="delta requires --update-weight-transport=disk"):
        parse_args(BASE + ["--update-weight-mode", "delta"])
    with pytest.raises(SlimeError, match="disk requires --update-weight-disk-dir"):
        parse_args(BASE + ["--update-weight-transport", "disk"])


def test_sglang_server_command_forwards_every_sglang_arg_verbatim():
    a = parse_args(
        SGLANG
        + [
            "--hf-checkpoint",
            "/models/qwen",
            "--rollout-num-gpus",
            "4",
            "--rollout-num-gpus-per-engine",
            "2",
            "--sglang-mem-fraction-static",
            "0.7",
            "--sglang-enable-dp-attention",
            "--sglang-dtype=bfloat16",
            "--sglang-cuda-graph-bs",
            "1",
            "2",
            "4",
        ]
    )
    host, cmd = sglang_server_command(a, rank=1, base_gpu_id=2, port=31234)
    assert host == "127.0.0.1"
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert cmd[3:] == [
        "--model-path",
        "/models/qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
        "--tp-size",
        "2",
        "--base-gpu-id",
        "2",
        "--mem-fraction-static",
        "0.7",
        "--enable-dp-attention",
        "--dtype=bfloat16",
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
        "--random-seed",
        str(a.seed + 1),
        "--api-key",
        a.engine_api_key,
        "--admin-api-key",
        a.engine_admin_api_key,
    ]
    assert len(a.engine_api_key) >= 40  # the run's own key (one per run), as both keys


def test_run_key_is_the_users_own_and_never_saved(tmp_path):
    from slime.arguments.parser import save_args
    from slime.ray.engine_launch import key_env, launch_spec

    a = parse_args(BASE + ["--hf-checkpoint", "m", "--rollout-backend", "builtin", "--sglang-api-key", "mine"])
    assert (a.engine_api_key, a.engine_admin_api_key) == ("mine", None)
    assert "--api-key" not in launch_spec(a, 0).extra and key_env(a) == {"SLIME_API_KEY": "mine"}
    b = parse_args(BASE + ["--hf-checkpoint", "m", "--rollout-backend", "builtin"])
    assert (
        b.engine_api_key == b.engine_admin_api_key
        and b.engine_api_key
        != parse_args(BASE + ["--hf-checkpoint", "m", "--rollout-backend", "builtin"]).engine_api_key
    )
    save_args(b, tmp_path / "args.json")
    assert b.engine_api_key not in (tmp_path / "args.json").read_text()
    external = parse_args(
        BASE + ["--hf-checkpoint", "m", "--sglang-router-ip", "10.0.0.1", "--sglang-router-port", "1"]
    )
    assert external.engine_api_key is None  # nothing to send to a user's server without a key


def test_sglang_server_command_host_port_and_owned_args():
    a = parse_args(
        SGLANG
        + ["--hf-checkpoint", "m", "--sglang-host", "0.0.0.0", "--sglang-port", "30000", "--sglang-random-seed", "7"]
    )
    host, cmd = sglang_server_command(a, rank=3, base_gpu_id=3, port=1)
    assert host == "0.0.0.0"
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd.count("--host") == 1
    assert cmd[cmd.index("--port") + 1] == "30003" and cmd.count("--port") == 1
    assert cmd[cmd.index("--random-seed") + 1] == "7" and cmd.count("--random-seed") == 1
    for flag, names in [
        ("--sglang-tp-size", "--rollout-num-gpus-per-engine"),
        ("--sglang-model-path", "--hf-checkpoint"),
        ("--sglang-base-gpu-id", "placement"),
    ]:
        b = parse_args(SGLANG + ["--hf-checkpoint", "m", flag, "2"])
        with pytest.raises(SlimeError, match=f"{flag}.*{names}"):
            sglang_server_command(b, rank=0, base_gpu_id=0, port=1)


@pytest.fixture
def fake_sglang(monkeypatch):
    """A stand-in `sglang` package whose ServerArgs parser has a few of SGLang's arguments."""

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--model-path", required=True)
            parser.add_argument("--host")
            parser.add_argument("--port", type=int)
            parser.add_argument("--mem-fraction-static", type=float)
            parser.add_argument("--dtype", choices=["auto", "bfloat16", "float16"])
            parser.add_argument("--enable-dp-attention", action="store_true")

    pkg = types.ModuleType("sglang")
    pkg.__spec__ = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
    srt = types.ModuleType("sglang.srt")
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.ServerArgs = ServerArgs
    for name, mod in [("sglang", pkg), ("sglang.srt", srt), ("sglang.srt.server_args", server_args)]:
        monkeypatch.setitem(sys.modules, name, mod)
    return ServerArgs


def test_sglang_args_validated_against_sglangs_own_parser(fake_sglang):
    validate_sglang_args(["--mem-fraction-static", "0.8", "--dtype", "bfloat16", "--enable-dp-attention"])
    with pytest.raises(
        SlimeError, match="unknown engine argument --sglang-mem-fraction.*did you mean --sglang-mem-fraction-static"
    ):
        validate_sglang_args(["--mem-fraction", "0.8"])
    with pytest.raises(SlimeError, match="invalid --sglang-\\* arguments.*--dtype"):
        validate_sglang_args(["--dtype", "int3"])
    with pytest.raises(SlimeError, match="--sglang-tp-size is set by the framework"):
        validate_sglang_args(["--tp-size", "2"])


def test_builtin_engine_args_still_validated_against_the_builtin_parser(fake_sglang):
    """With sglang importable, the builtin backend still checks the builtin engine's parser."""
    check_engine_args(["--max-running-requests", "8"])
    with pytest.raises(SlimeError, match="the built-in engine has no --enable-dp-attention"):
        check_engine_args(["--enable-dp-attention"])


def test_sglang_backend_without_sglang_says_so():
    assert not sglang_installed()
    with pytest.raises(SlimeError, match="--rollout-backend sglang needs the `sglang` package"):
        validate_sglang_args([])


def test_router_command_lines_bind_loopback():
    cmd = sglang_router_command("consistent_hashing", "127.0.0.1", 1000, 1001, ["http://127.0.0.1:5"], "/m")
    assert cmd[1:3] == ["-m", "slime.ray.router"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--policy") + 1] == "consistent_hashing"
    assert cmd[cmd.index("--worker-urls") + 1 :] == ["http://127.0.0.1:5"]
    with pytest.raises(SlimeError, match="--router-policy"):
        sglang_router_command("fastest", "127.0.0.1", 1, 2, [])
    d = dispatcher_command("127.0.0.1", 1000, [])
    assert d[1:3] == ["-m", "slime.ray.dispatcher"] and d[d.index("--host") + 1] == "127.0.0.1"


def test_sglang_router_python_api_takes_consistent_hashing():
    """sglang-router's CLI lacks consistent_hashing; `slime.ray.router` sets it on RouterArgs."""
    pytest.importorskip("sglang_router")
    from sglang_router.launch_router import parse_router_args
    from sglang_router.router import policy_from_str

    ra = parse_router_args(["--host", "127.0.0.1", "--port", "1"])
    ra.policy = "consistent_hashing"
    ra._validate_router_args()
    assert policy_from_str(ra.policy) is not None


def test_default_generate_sends_the_session_routing_key(tiny_model_dir, monkeypatch):
    from slime.rollout import generation, sglang_rollout
    from slime.utils.types import Sample

    seen = []

    async def fake_post(url, payload, max_retries=60, retry_interval=1.0, headers=None):
        seen.append(headers)
        n = len(payload["input_ids"]) if isinstance(payload["input_ids"][0], list) else None
        one = {
            "text": "x",
            "output_ids": [5],
            "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.1, 5, None]]},
        }
        return [one] * n if n else one

    monkeypatch.setattr(generation, "post", fake_post)  # where the default generate posts
    args = parse_args(
        BASE + ["--hf-checkpoint", str(tiny_model_dir), "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "1"]
    )
    sglang_rollout.GenerateState.reset()
    try:
        params = sglang_rollout.sampling_params_from_args(args, evaluation=False)
        s = Sample(tokens=[1, 2, 3], session_id="traj-7")
        asyncio.run(sglang_rollout.generate(args, s, params))
        asyncio.run(sglang_rollout.generate(args, Sample(tokens=[1, 2]), params))
        group = [Sample(tokens=[1, 2], session_id="traj-9"), Sample(tokens=[1, 2], session_id="traj-9")]
        asyncio.run(generation._generate_group_batched(args, group, params))
    finally:
        sglang_rollout.GenerateState.reset()
    assert seen == [{"X-SMG-Routing-Key": "traj-7"}, None, {"X-SMG-Routing-Key": "traj-9"}]
    assert s.tokens == [1, 2, 3, 5] and s.session_id == "traj-7"


def test_sglang_options_the_builtin_engine_cannot_use_are_named_not_forwarded():
    """SGLang's own options (data: sglang_server_args.json) parse with the built-in engine too: kept
    off its command line and named once at start-up; a name neither knows is an error."""
    a = parse_args(
        BASE
        + [
            "--sglang-cuda-graph-bs",
            "1",
            "2",
            "4",
            "--sglang-enable-dp-attention",
            "--sglang-max-running-requests",
            "8",
            "--sglang-ep-size",
            "2",
        ]
    )
    assert a.sglang_args == ["--max-running-requests", "8"]
    note = next(n for n in startup_notes(a) if n.startswith("SGLang options"))
    assert "--sglang-cuda-graph-bs 1 2 4" in note and "--sglang-enable-dp-attention" in note
    assert "--sglang-ep-size 2" in note and "max-running-requests" not in note
    with_sglang = parse_args(SGLANG + ["--sglang-cuda-graph-bs", "1", "2", "--sglang-enable-dp-attention"])
    assert with_sglang.sglang_args == ["--cuda-graph-bs", "1", "2", "--enable-dp-attention"]
    assert not [n for n in startup_notes(with_sglang) if n.startswith("SGLang options")]
    with pytest.raises(
        SlimeError, match="unknown engine argument --sglang-cuda-graph-bss.*did you mean --sglang-cuda-graph-bs"
    ):
        parse_args(BASE + ["--sglang-cuda-graph-bss", "1"])


def test_parser_options_reach_the_engine_and_the_agent_adapter():
    """--sglang-tool-call-parser / --sglang-reasoning-parser: the built-in engine parses with them
    (its /v1/chat/completions), and slime's agent adapter (--agent-function-path) reads them too;
    neither is named as unused."""
    from slime.agent.generate import engine_parser_option

    parsers = ["--sglang-tool-call-parser", "qwen25", "--sglang-reasoning-parser=qwen3"]
    agent = [
        "--custom-generate-function-path",
        "slime.agent.generate.generate",
        "--agent-function-path",
        "examples.openai_agent.agent.run",
    ]
    for argv in (BASE + agent + parsers, BASE + parsers):
        a = parse_args(argv)
        assert not [n for n in startup_notes(a) if n.startswith("SGLang options")]
        assert a.sglang_args == ["--tool-call-parser", "qwen25", "--reasoning-parser=qwen3"]
    assert engine_parser_option(a, "--tool-call-parser") == "qwen25"  # still reaches the adapter
    assert engine_parser_option(a, "--reasoning-parser") == "qwen3"
    note = next(
        n
        for n in startup_notes(parse_args(BASE + agent + parsers + ["--sglang-ep-size", "2"]))
        if n.startswith("SGLang options")
    )
    assert note.endswith("not used by the built-in engine: --sglang-ep-size 2")


def test_router_options_are_checked_against_sglang_routers_parser():
    from slime.ray.router import check_router_args

    a = parse_args(BASE + ["--router-balance-abs-threshold", "5", "--router-log-level", "debug"])
    assert a.router_args == ["--balance-abs-threshold", "5", "--log-level", "debug"]
    assert a.router_policy == "cache_aware"  # slime-rl's own option is not passed through
    assert check_router_args(a.router_args) is None
    with pytest.raises(
        SlimeError,
        match="unknown router argument --router-balance-abs-treshold .*did you mean --router-balance-abs-threshold",
    ):
        check_router_args(parse_args(BASE + ["--router-balance-abs-treshold", "5"]).router_args)
    with pytest.raises(SlimeError, match="invalid --router-\\* arguments for sglang-router.*balance-abs-threshold"):
        check_router_args(["--balance-abs-threshold", "five"])
    with pytest.raises(SlimeError, match="--router-worker-urls is set by the framework"):
        check_router_args(["--worker-urls", "http://x"])


def test_router_options_without_sglang_router_are_named_not_dropped(monkeypatch):
    from slime.ray import router

    monkeypatch.setattr(router, "sglang_router_available", lambda: False)
    note = router.check_router_args(["--log-level", "debug"])
    assert (
        note == "sglang-router is not installed: --router-log-level debug not used (the built-in dispatcher takes none)"
    )
