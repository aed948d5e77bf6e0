"""The code sandbox and the `code` reward against an adversarial policy: a sandbox and rewards
that hold against the policy.

Everything here goes through the public API a rollout uses (`async_rm` with `--rm-type code`, or
`run_python` for tool calls), as a policy's program would, and checks the host side: the reward,
files on the host, host processes, a loopback listener. The list of attacks is the documented
"adversarial" list of `slime.rollout.rm_hub` (docs/rewards-and-sandbox.md, "The adversarial list").
"""

import asyncio
import glob
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from slime.errors import SlimeError
from slime.rollout.rm_hub import async_rm
from slime.rollout.rm_hub.code import grade_code
from slime.sandbox import SandboxLimits, SandboxUnavailable, check_sandbox, isolation, run_python
from slime.sandbox import bwrap as sandbox_isolation
from slime.sandbox.bwrap import python_paths
from slime.sandbox.seccomp import seccomp_program
from slime.utils.types import Sample
from tests.helpers import alive, descendants, make_args

REPO = Path(__file__).resolve().parents[2]
FAST = dict(sandbox_timeout=10, sandbox_cpu_time=4, sandbox_memory_mb=512)

needs_bwrap = pytest.mark.skipif(
    isolation() != "bwrap", reason="bubblewrap sandbox not available here (scripts/setup.sh installs it)"
)


def _pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def code_reward(program: str, tests, **kw) -> tuple[float, str]:
    args = make_args(rm_type="code", **{**FAST, **kw})
    sample = Sample(response=f"```python\n{program}\n```", label=tests, metadata={})
    reward = asyncio.run(async_rm(args, sample))
    return reward, sample.metadata.get("code_result", "")


ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15"
WRONG_ADD = "def add(a, b):\n    return 0\n"


def test_isolation_is_bubblewrap_here():
    """setup.sh installs bubblewrap; CI must exercise the real sandbox, not the fallback."""
    assert isolation() == "bwrap", sandbox_isolation.isolation_problem()


@needs_bwrap
def test_a_correct_solution_passes_and_a_wrong_one_fails():
    assert code_reward("def add(a, b):\n    return a + b", ADD_TESTS) == (1.0, "passed")
    assert code_reward(WRONG_ADD, ADD_TESTS) == (0.0, "tests line 1: assertion failed")


# ------------------------------------------------- rewards (the tricks: tests/sandbox/test_reward_hacking.py)


@needs_bwrap
def test_io_cases_judge_the_output_not_the_exit_status():
    cases = [{"input": "2 3\n", "output": "5"}, {"input": "10 -4", "output": "6"}]
    assert code_reward("a, b = map(int, input().split())\nprint(a + b)", cases)[0] == 1.0
    assert code_reward("import os\nos._exit(0)", cases)[0] == 0.0
    assert code_reward("print(5)\nimport os\nos._exit(0)", cases)[0] == 0.0


# ------------------------------------------------------------------ the sandbox holds the host


@needs_bwrap
def test_the_host_file_system_is_invisible_and_unwritable(tmp_path):
    secret = Path(tempfile.mkdtemp(prefix="escape-target-")) / "labels.jsonl"  # on the host's /tmp
    secret.write_text("the answers")
    targets = [
        str(secret),
        str(REPO / "README.md"),
        str(REPO / "escape.txt"),
        "/usr/escape.txt",
        "/escape.txt",
        "/etc/passwd",
        os.path.expanduser("~/escape.txt"),
        sys.prefix + "/escape.txt",
    ]
    program = textwrap.dedent(f"""
        import os, subprocess
        for cmd in (["umount", "-l", "/tmp"], ["umount", "-l", "/sandbox"], ["mount", "-o", "remount,bind,rw", "/"],
                    ["mount", "-o", "remount,rw", "/usr"], ["mount", "-t", "tmpfs", "x", "/usr"]):
            try:
                subprocess.run(cmd, capture_output=True, timeout=5)
            except OSError:
                pass
        for path in {targets!r}:
            try:
                print("LEAKED!", path, open(path).read()[:20])
            except OSError as e:
                print("noread", path, type(e).__name__)
            try:
                open(path, "a").write("pwned")
                print("WROTE!", path)
            except OSError as e:
                print("nowrite", path, type(e).__name__)
        print("ROOT", sorted(os.listdir("/")))
    """)
    r = run_python(program)
    assert r.ok, r.stderr
    assert "LEAKED!" not in r.stdout and "WROTE!" not in r.stdout, r.stdout
    assert secret.read_text() == "the answers"
    for path in targets[2:]:
        if path != "/etc/passwd":
            assert not os.path.exists(path), path
    root = eval(r.stdout.split("ROOT", 1)[1])  # only the system, Python and its own scratch
    assert set(root) <= {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "dev",
        "tmp",
        "sandbox",
        *list(sys.base_prefix.split("/")[1:2]),
    }, root
    secret.unlink()
    secret.parent.rmdir()


@needs_bwrap
def test_no_network_not_even_to_a_loopback_listener():
    accepted = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(3)
        port = listener.getsockname()[1]

        def accept():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        r = run_python(
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            f"    print('connected')\nexcept OSError as e:\n    print('refused', e)"
        )
        t.join(5)
    assert "connected" not in r.stdout and not accepted, r.stdout


@needs_bwrap
def test_cannot_see_or_signal_host_processes():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        program = textwrap.dedent(f"""
            import os, signal
            for pid in ({os.getpid()}, {bystander.pid}, os.getppid(), 1):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print("signalled", pid)
                except OSError as e:
                    print("cannot", pid, type(e).__name__)
            print("PIDS", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        """)
        r = run_python(program)
        time.sleep(0.2)
        assert bystander.poll() is None, "a host process was killed from the sandbox"
        assert len(eval(r.stdout.split("PIDS", 1)[1])) <= 3, r.stdout  # its own PID namespace
    finally:
        bystander.kill()
        bystander.wait()


@needs_bwrap
def test_fork_storm_hits_the_process_limit_and_leaves_nothing():
    before = len(_pids())
    r = run_python(
        "import os\nn = 0\nfor i in range(500):\n    if os.fork() == 0:\n        import time; time.sleep(30)\n"
        "    n += 1\nprint(n)",
        processes=16,
        timeout_s=10,
    )
    assert not r.ok and ("Resource temporarily unavailable" in r.stderr or "BlockingIOError" in r.stderr), r.reason
    time.sleep(0.5)
    assert len(_pids()) < before + 5  # the forked sleepers died with the sandbox


def _sandbox_cgroups() -> set[str]:
    """The sandbox cgroup directories there are now, wherever this process makes them."""
    parents = {*(sandbox_isolation._cgroup_parents() or {}), *glob.glob("/sys/fs/cgroup/*/")}
    return {p for parent in parents for p in glob.glob(os.path.join(parent, sandbox_isolation.CGROUP_PREFIX + "*"))}


# six children, each holding 40 MB at the same time: 240 MB in all, each one far below 128 MB
FORKED_HOGS = textwrap.dedent("""
    import os, sys, time
    kids = []
    for i in range(6):
        pid = os.fork()
        if pid == 0:
            block = b"x" * (40 << 20)
            print("held", i, flush=True)
            time.sleep(3)  # long enough that the blocks overlap even on a loaded machine
            print("done", i, flush=True)
            os._exit(0)
        kids.append(pid)
    failed = [os.waitpid(pid, 0)[1] != 0 for pid in kids]
    sys.exit(1 if any(failed) else 0)
""")


@needs_bwrap
def test_memory_is_bounded_for_all_processes_together():
    r = run_python(FORKED_HOGS, memory_mb=128, processes=16, timeout_s=30)
    assert not r.ok and r.memory_limit, (r.returncode, r.stdout, r.stderr[-300:])
    assert r.reason == "memory limit (all processes together)"
    # some child was killed holding its block (each may print "held" first: an allocation past the
    # bound kills an earlier holder, so all six can have held theirs, never all at once)
    assert r.stdout.count("done") < 6, r.stdout


@needs_bwrap
def test_memory_in_files_counts_too():
    memfd = (
        "import os\nfd = os.memfd_create('x')\nfor i in range(150):\n    os.write(fd, b'x' * (1 << 20))\nprint('wrote')"
    )
    tmpfs = "f = open('/tmp/big', 'wb')\nfor i in range(150):\n    f.write(b'x' * (1 << 20))\nf.flush()\nprint('wrote')"
    for program in (memfd, tmpfs):
        r = run_python(program, memory_mb=64, file_mb=1024, scratch_mb=1024, timeout_s=30)
        assert not r.ok and "wrote" not in r.stdout, (program, r.stdout)
        assert r.memory_limit and r.reason == "memory limit (all processes together)", (program, r.reason)


@needs_bwrap
def test_a_program_within_the_memory_limit_runs():
    r = run_python(
        "block = bytearray(50 << 20)\nblock[::4096] = b'y' * len(block[::4096])\nprint(len(block))", memory_mb=256
    )
    assert r.ok and r.stdout == f"{50 << 20}\n" and not r.memory_limit, r.stderr[-300:]
    # a single allocation past the limit fails in the program (the per-process address-space limit)
    r = run_python("try:\n    bytearray(300 << 20)\nexcept MemoryError:\n    print('MemoryError')", memory_mb=256)
    assert r.ok and r.stdout == "MemoryError\n", r.stderr[-300:]


NEW_PROCESSES = textwrap.dedent("""
    import ctypes, errno, os, subprocess, sys, threading
    refused = []
    def attempt(name, start):
        try:
            start()
            print(name, "started")
        except OSError as e:
            print(name, "refused", type(e).__name__)
            refused.append(name)
    def fork():
        if os.fork() == 0:
            os._exit(0)
    attempt("fork", fork)
    attempt("subprocess.run", lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    # a preexec_fn makes _posixsubprocess.fork_exec fork rather than vfork
    attempt("fork_exec", lambda: subprocess.run(["/bin/true"], preexec_fn=lambda: None, check=True))
    attempt("posix_spawn", lambda: os.waitpid(os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {}), 0))
    done = []
    thread = threading.Thread(target=lambda: done.append(sum(range(10))))
    thread.start()
    thread.join()
    print("thread", done)
    if os.uname().machine == "x86_64" and refused:  # the system calls themselves, past the C library
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(nr, *args):
            pid = libc.syscall(nr, *args)
            if pid == 0:
                os._exit(0)
            return pid, errno.errorcode.get(ctypes.get_errno(), "") if pid < 0 else "started"
        print("raw", (raw(57), raw(58), raw(56, 17, 0, 0, 0, 0), raw(435, 0, 0)))  # fork, vfork, clone(SIGCHLD), clone3
""")


@needs_bwrap
def test_new_processes_can_be_refused_by_the_kernel():
    r = run_python(NEW_PROCESSES, new_processes=False)
    assert r.ok, r.stderr[-500:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for name in ("fork", "subprocess.run", "fork_exec", "posix_spawn"):
        assert lines[name] == "refused PermissionError", (name, r.stdout)
    assert lines["thread"] == "[45]"
    if os.uname().machine == "x86_64":
        assert eval(lines["raw"]) == ((-1, "EPERM"), (-1, "EPERM"), (-1, "EPERM"), (-1, "ENOSYS")), r.stdout
    r = run_python(NEW_PROCESSES)  # by default a program may start processes (within its limits)
    assert r.ok and "fork started" in r.stdout and "subprocess.run started" in r.stdout, r.stdout


def _run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What a classic-BPF seccomp filter answers for one system call (the instructions it uses only)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld word at k
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x06:  # ret k
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_process_filter_allows_threads_only(machine):
    allow, eperm, enosys = 0x7FFF0000, 0x00050001, 0x00050026
    audit_arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
    clone, clone3, openat = {"x86_64": (56, 435, 257), "aarch64": (220, 435, 56)}[machine]
    thread, process = 0x3D0F00, 0x11  # pthread_create's flags (with CLONE_THREAD); fork's (SIGCHLD)
    blocking, default = seccomp_program(machine, block_processes=True), seccomp_program(machine)
    assert _run_bpf(blocking, clone, audit_arch, thread) == allow
    assert _run_bpf(blocking, clone, audit_arch, process) == eperm
    assert _run_bpf(blocking, clone, audit_arch, 0x4111) == eperm  # CLONE_VM | CLONE_VFORK | SIGCHLD (posix_spawn)
    assert _run_bpf(blocking, clone3, audit_arch) == enosys
    assert _run_bpf(blocking, openat, audit_arch) == allow
    assert _run_bpf(blocking, clone, 0x40000003) == eperm  # another ABI
    if machine == "x86_64":
        assert _run_bpf(blocking, 57, audit_arch) == eperm and _run_bpf(blocking, 58, audit_arch) == eperm
        assert _run_bpf(blocking, 59, audit_arch) == allow  # execve: bubblewrap execs the program after the filter
    for nr in (clone, clone3, openat):  # without block_processes, processes may be created
        assert _run_bpf(default, nr, audit_arch, process) == allow
    assert _run_bpf(default, 272 if machine == "x86_64" else 97, audit_arch) == eperm  # unshare, as before


@needs_bwrap
def test_no_cgroup_is_left_behind():
    before = _sandbox_cgroups()
    run_python("print(1)")
    run_python(FORKED_HOGS, memory_mb=128, processes=16, timeout_s=30)
    # a process that left the session (and so the process group the caller kills) still goes with the cgroup
    escaped = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)"
    r = run_python(escaped, timeout_s=1)
    assert r.timed_out
    run_python("print(1)", allow_unisolated=True)
    assert _sandbox_cgroups() == before


@needs_bwrap
def test_output_flood_is_cut_while_it_streams():
    t0 = time.monotonic()
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", max_output_kb=256, timeout_s=20)
    assert r.output_limit and not r.ok and r.reason == "output limit"
    assert len(r.stdout) <= 256 * 1024 and time.monotonic() - t0 < 10


@needs_bwrap
def test_disk_fill_stops_at_the_scratch_size():
    r = run_python("f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))", scratch_mb=8, file_mb=100)
    assert not r.ok and "No space left on device" in r.stderr, r.stderr[-300:]
    r = run_python("open('big', 'wb').write(b'x' * (20 << 20))", file_mb=4, scratch_mb=64)
    assert not r.ok and "File too large" in r.stderr


@needs_bwrap
def test_seccomp_refuses_kernel_interfaces():
    assert seccomp_program() is not None
    r = run_python(
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.syscall(272, 0), ctypes.get_errno() == errno.EPERM)\n"  # unshare(0)
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('Seccomp:', 'CapEff:', 'NoNewPrivs:'))])"
    )
    assert r.ok, r.stderr
    lines = r.stdout.split("\n")
    if os.uname().machine == "x86_64":
        assert lines[0] == "-1 True"
    assert eval(lines[1]) == ["0000000000000000", "1", "2"]  # no capabilities, no_new_privs, filter on


@needs_bwrap
def test_sleeper_dies_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        "from slime.sandbox import run_python\nrun_python('import time; time.sleep(120)', timeout_s=120, cpu_s=120)\n"
    )
    cgroups = _sandbox_cgroups()
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        tree: dict[int, str] = {}
        while time.monotonic() < deadline:
            tree = {pid: _cmdline(pid) for pid in descendants(parent.pid)}
            # the program itself (bwrap's own command line names the runner too, before it started it)
            if any(c.startswith(python_paths()[0]) and "_sandbox_runner.py" in c for c in tree.values()):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the sandboxed sleeper never started")
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(pid) for pid in tree):
            time.sleep(0.1)
        survivors = {pid: c for pid, c in tree.items() if alive(pid)}
        assert not survivors, survivors
        # the killed caller never removed its cgroup: that is what remove_stale_cgroups is for (past an age)
        left = _sandbox_cgroups() - cgroups
        deadline = time.monotonic() + 10
        while _sandbox_cgroups() & left and time.monotonic() < deadline:
            sandbox_isolation.remove_stale_cgroups(min_age_s=0)
            time.sleep(0.1)
        assert not _sandbox_cgroups() & left
    finally:
        if parent.poll() is None:
            parent.kill()


# --------------------------------------------------------------------- limits and refusal


def test_limits_that_make_no_sense_stop_at_parsing():
    for option in (
        "--sandbox-memory-mb",
        "--sandbox-processes",
        "--sandbox-scratch-mb",
        "--sandbox-timeout",
        "--sandbox-max-output-kb",
    ):
        for bad in ("0", "-5"):
            with pytest.raises(SlimeError, match=option):
                make_args(rm_type="code", **{option[2:].replace("-", "_"): bad})
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)


def test_missing_bubblewrap_refuses_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    problem = sandbox_isolation.isolation_problem.__wrapped__()
    assert "bubblewrap" in problem and "apt-get install -y bubblewrap" in problem
    monkeypatch.setattr(sandbox_isolation, "isolation_problem", lambda: problem)
    monkeypatch.setattr("slime.sandbox.run.isolation_problem", lambda: problem)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap.*--sandbox-allow-unisolated"):
        check_sandbox(allow_unisolated=False)
    with pytest.raises(SandboxUnavailable):
        run_python("print(1)")
    from slime.preflight import check_reward

    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        check_reward(make_args(rm_type="code"))
    check_reward(make_args(rm_type="code", sandbox_allow_unisolated=True))  # explicitly allowed
    # allowed: a plain child process under rlimits, with sockets and processes refused in Python
    r = run_python("import socket\nsocket.socket().connect(('127.0.0.1', 9))", allow_unisolated=True)
    assert not r.ok and "not allowed" in r.stderr
    assert grade_code("def add(a, b):\n    return a + b", ADD_TESTS, allow_unisolated=True) == (1.0, "passed")


def test_without_a_memory_and_pids_cgroup_the_sandbox_is_not_isolated(monkeypatch):
    monkeypatch.setattr(sandbox_isolation, "_cgroup_parents", lambda: None)
    problem = sandbox_isolation.isolation_problem.__wrapped__()
    assert "memory+pids cgroup" in problem and "run slime as root" in problem and "\n" not in problem
    monkeypatch.setattr("slime.sandbox.run.isolation_problem", lambda: problem)
    with pytest.raises(SandboxUnavailable, match="memory\\+pids cgroup.*--sandbox-allow-unisolated"):
        check_sandbox(allow_unisolated=False)
