"""Server process lifecycle: stop() leaves nothing behind, no orphan when the parent dies,
launch failures report the server's log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slime.ray.engine_process import EngineLaunchError, EngineProcess

pytestmark = pytest.mark.timeout(120)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.e2e
def test_stop_leaves_no_process(tiny_model_dir, tmp_path):
    eng = EngineProcess.start(tiny_model_dir, num_threads=1, log_path=tmp_path / "e.log")
    with eng:
        eng.wait_until_healthy(timeout=120)
        pid = eng.pid
        assert pid_alive(pid)
    assert not pid_alive(pid) and eng.proc.returncode is not None
    eng.stop()  # idempotent
    assert "ready at" in (tmp_path / "e.log").read_text()


@pytest.mark.e2e
def test_server_exits_when_parent_dies(tiny_model_dir, tmp_path):
    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(repo)!r})
        from slime.ray.engine_process import EngineProcess
        e = EngineProcess.start({str(tiny_model_dir)!r}, num_threads=1, log_path={str(tmp_path / "child.log")!r})
        e.wait_until_healthy(timeout=120)
        print(e.pid, flush=True)
        time.sleep(600)
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip(), "the parent did not start the server"
        server_pid = int(line)
        assert pid_alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while pid_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(server_pid), "engine server outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert "parent process" in (tmp_path / "child.log").read_text()


@pytest.mark.e2e
def test_launch_failure_reports_log_tail(tmp_path):
    eng = EngineProcess.start(tmp_path / "no-such-model", num_threads=1, log_path=tmp_path / "bad.log")
    try:
        with pytest.raises(EngineLaunchError) as ei:
            eng.wait_until_healthy(timeout=60)
        msg = str(ei.value)
        assert "exited with code" in msg and "no-such-model" in msg
    finally:
        eng.stop()
    assert not eng.is_alive()


def test_server_arg_parser_knows_passthrough_names():
    from slime.engine.args import build_arg_parser

    args = build_arg_parser().parse_args(["--model-path", "m", "--dtype", "bfloat16", "--max-running-requests", "8"])
    assert args.dtype == "bfloat16" and args.max_running_requests == 8 and args.host == "127.0.0.1"
    with pytest.raises(SystemExit):
        build_arg_parser().parse_args(["--model-path", "m", "--no-such-flag", "1"])


def test_server_takes_sglang_launch_server_options_it_does_not_use(capsys):
    """A command line written for `python -m sglang.launch_server` (slime's distillation example
    starts its teacher so) runs with `slime serve` in its place: SGLang's options this engine has
    no use for are returned to be named at start-up, `--tp` read as SGLang's `--tp-size` (an
    argparse abbreviation SGLang accepts); a name neither has still stops it, with the closest name."""
    from slime.engine.args import parse_server_args

    teacher = ["--model-path", "m", "--host", "0.0.0.0", "--port", "13141", "--tp", "1"]
    args, not_used = parse_server_args([*teacher, "--chunked-prefill-size", "4096", "--mem-fraction-static", "0.6"])
    assert (args.host, args.port, args.mem_fraction_static) == ("0.0.0.0", 13141, 0.6)
    assert not_used == ["--tp 1", "--chunked-prefill-size 4096"]
    assert parse_server_args(["--model-path", "m"])[1] == []
    with pytest.raises(SystemExit):
        parse_server_args([*teacher, "--chunked-prefil-size", "4096"])
    assert "did you mean --chunked-prefill-size?" in capsys.readouterr().err


def test_server_alone_uses_every_core_a_run_passes_its_budget(monkeypatch):
    """`slime serve` started on its own uses all the cores it may run on; a run's engines
    get --num-threads from the run's thread budget (EngineProcess always passes it)."""
    import inspect

    from slime.engine.args import build_arg_parser, server_threads
    from slime.ray.engine_process import EngineProcess

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 5}, raising=False)
    alone = build_arg_parser().parse_args(["--model-path", "m"])
    assert alone.num_threads is None and server_threads(alone) == 4
    assert server_threads(build_arg_parser().parse_args(["--model-path", "m", "--num-threads", "1"])) == 1
    source = " ".join(inspect.getsource(EngineProcess.start).split())  # line breaks are the formatter's
    assert '"--num-threads", str(num_threads)' in source


@pytest.mark.e2e
def test_sigterm_answers_in_flight_requests(tiny_model_dir, tmp_path):
    import concurrent.futures

    from slime.engine.client import EngineClient

    eng = EngineProcess.start(
        tiny_model_dir, num_threads=1, log_path=tmp_path / "e.log", extra_args=["--step-delay-ms", "20"]
    )
    with eng, concurrent.futures.ThreadPoolExecutor(1) as ex:
        eng.wait_until_healthy(timeout=120)
        client = EngineClient(eng.url, timeout=30)
        fut = ex.submit(
            client.generate,
            {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}},
        )
        deadline = time.monotonic() + 10
        while client.get_load()["num_tokens"] <= 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        eng.stop()
        r = fut.result(timeout=10)
        assert r["meta_info"]["finish_reason"]["type"] == "abort"
        assert time.monotonic() - t0 < 5
        client.close()


@pytest.mark.e2e
def test_engines_get_the_mkl_vendor_shim_where_it_applies(tiny_model_dir, tmp_path):
    """A launched engine has the shim preloaded exactly where slime.runtime.mkl_vendor says it
    applies, not with mkl_vendor_shim=False; started by hand (no preload in its environment) the
    server starts itself again with it, in the same process id."""
    from slime.runtime.mkl_vendor import loaded, not_applicable
    from slime.utils.net import free_port

    applies = not_applicable() is None
    for shim in (True, False):
        with EngineProcess.start(
            tiny_model_dir, num_threads=1, log_path=tmp_path / f"e{shim}.log", mkl_vendor_shim=shim
        ) as eng:
            eng.wait_until_healthy(timeout=120)
            assert loaded(eng.pid) == (shim and applies)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    with open(tmp_path / "hand.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slime.engine.server",
                "--model-path",
                str(tiny_model_dir),
                "--port",
                str(port),
                "--num-threads",
                "1",
            ],
            env=env,
            stdout=log,
            stderr=log,
        )
    eng = EngineProcess(
        proc, f"http://127.0.0.1:{port}", "127.0.0.1", port, tmp_path / "hand.log", open(os.devnull, "wb")
    )
    with eng:
        eng.wait_until_healthy(timeout=120)
        assert loaded(proc.pid) == applies
