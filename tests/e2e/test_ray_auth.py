"""The local Ray cluster slime starts: token authentication on, every Ray port on 127.0.0.1.

Each case runs in its own interpreter: init_ray changes the process's environment and Ray's
cached configuration, which must not leak into the rest of the test session.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

# Listening TCP sockets of a process tree, from /proc (no psutil needed).
_LISTEN = r"""
import os, socket

def _descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, i = [root], 0
    while i < len(out):
        out += kids.get(out[i], [])
        i += 1
    return out

def _addr(hexaddr, v6):
    ip, port = hexaddr.split(":")
    b = bytes.fromhex(ip)
    if v6:
        b = b"".join(b[i:i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, b), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, b[::-1]), int(port, 16)

def listening(root):
    inodes = {}
    for pid in _descendants(root):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
    out = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                host, port = _addr(f[1], v6)
                out.append([host, port, inodes[f[9]]])
    return out
"""

_DRIVER = (
    _LISTEN
    + r'''
import json, subprocess, sys, time
from argparse import Namespace

t = time.time()
from slime.ray.placement_group import init_ray
import ray
from ray._raylet import AuthenticationMode, get_authentication_mode

init_ray(Namespace(colocate=True, actor_world_size=1, rollout_num_gpus=1, debug_rollout_only=False,
                 debug_train_only=False, mkl_vendor_shim=True))
start_s = time.time() - t

@ray.remote(num_cpus=0)
class Probe:
    def env(self):
        return os.environ.get("RAY_AUTH_MODE")

    def shim(self):
        from slime.runtime.mkl_vendor import loaded
        return loaded()

probe_actor = Probe.remote()
worker_mode = ray.get(probe_actor.env.remote())
worker_shim = ray.get(probe_actor.shim.remote())
gcs = ray.get_runtime_context().gcs_address
probe = f"""
from ray._raylet import GcsClient
try:
    GcsClient(address={gcs!r}).internal_kv_get(b"x", None, timeout=10)
    print("ACCEPTED")
except Exception as e:
    print("REFUSED", type(e).__name__)
"""
clients = {}
base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
for name, extra in {"no_token": {"RAY_AUTH_MODE": "disabled"},
                    "wrong_token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                    "token": {"RAY_AUTH_MODE": "token"}}.items():
    r = subprocess.run([sys.executable, "-c", probe], env={**base, **extra}, capture_output=True, text=True,
                       timeout=60)
    clients[name] = (r.stdout.strip().splitlines() or [r.stderr[-300:]])[-1]
print("RESULT " + json.dumps({
    "mode_token": get_authentication_mode() == AuthenticationMode.TOKEN,
    "worker_mode": worker_mode,
    "worker_shim": worker_shim,
    "gcs": gcs,
    "node_ip": ray.util.get_node_ip_address(),
    "listening": listening(os.getpid()),
    "clients": clients,
    "start_s": start_s,
}))
ray.shutdown()
'''
)


def _run(code: str, drop=("RAY_AUTH_MODE", "RAY_ADDRESS"), **env_over) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_over)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=150
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_local_cluster_has_token_auth_and_listens_on_loopback_only():
    proc = _run(_DRIVER)
    res = _result(proc)
    assert res["mode_token"] and res["worker_mode"] == "token"
    # the MKL vendor shim reaches the workers exactly where it applies (slime.runtime.mkl_vendor)
    from slime.runtime.mkl_vendor import not_applicable

    assert res["worker_shim"] == (not_applicable() is None)
    # A client without the token, or with a wrong one, is refused; with the token it gets in.
    assert res["clients"] == {
        "no_token": "REFUSED AuthenticationError",
        "wrong_token": "REFUSED AuthenticationError",
        "token": "ACCEPTED",
    }, res["clients"]
    assert res["node_ip"] == "127.0.0.1" and res["gcs"].startswith("127.0.0.1:")
    names = {n for _, _, n in res["listening"]}
    assert {"gcs_server", "raylet"} <= names, res["listening"]
    loopback = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
    assert all(h in loopback for h, _, _ in res["listening"]), res["listening"]
    # Ray's "token authentication is enabled" notice is not printed: slime sets the mode itself.
    assert "Set RAY_AUTH_MODE=disabled to opt out" not in proc.stderr
    token = Path.home() / ".ray" / "auth_token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        assert token.exists() and token.stat().st_mode & 0o077 == 0


def test_explicit_opt_out_is_respected_with_a_warning():
    code = r"""
import logging, os
logging.basicConfig(level=logging.WARNING)
from slime.ray.placement_group import _configure_auth
print("RESULT", _configure_auth(joining=False), os.environ["RAY_AUTH_MODE"])
"""
    proc = _run(code, RAY_AUTH_MODE="disabled")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT False disabled" in proc.stdout
    assert "token authentication is OFF" in proc.stderr


def test_joining_a_cluster_without_a_token_says_what_to_do(tmp_path):
    code = r"""
from slime.ray.placement_group import _configure_auth
try:
    _configure_auth(joining=True)
    print("RESULT joined")
except RuntimeError as e:
    print("RESULT", e)
"""
    # HOME without ~/.ray/auth_token and no token variables: nothing to authenticate with.
    drop = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    proc = _run(code, drop=drop, HOME=str(tmp_path), RAY_ADDRESS="127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no token was found" in proc.stdout and "ray get-auth-token" in proc.stdout


def test_a_later_cluster_in_the_same_process_gets_its_own_mode():
    """A process that ran a token cluster and then starts one with RAY_AUTH_MODE=disabled (a caller
    running several jobs, the test session): Ray's cached mode follows, else the driver refuses the
    new cluster's calls and every actor it creates is destroyed before it starts."""
    code = r"""
import os
from argparse import Namespace
import ray
from slime.ray.placement_group import init_ray

@ray.remote(num_cpus=0)
class A:
    def mode(self):
        return os.environ.get("RAY_AUTH_MODE")

args = Namespace(colocate=True, actor_world_size=1, rollout_num_gpus=1, debug_rollout_only=False,
                 debug_train_only=False, mkl_vendor_shim=False)
for mode in ("token", "disabled"):
    os.environ["RAY_AUTH_MODE"] = mode
    init_ray(args)
    try:
        print("RESULT", mode, ray.get(A.remote().mode.remote(), timeout=60), flush=True)
    except Exception as e:
        print("RESULT", mode, "failed:", type(e).__name__, flush=True)
    ray.shutdown()
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")] == [
        "RESULT token token",
        "RESULT disabled disabled",
    ], proc.stdout
