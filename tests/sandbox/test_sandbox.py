"""The code sandbox and the `code` reward against an adversarial policy: a sandbox and rewards
that hold against the policy.

Everything here goes through the public API a rollout uses (`async_rm` with `--rm-type code`, or
`run_python` for tool calls), as a policy's program would, and checks the host side: the reward,
files on the host, host processes, a loopback listener. The list of attacks is the documented
"adversarial" list of `slime.rollout.rm_hub` (see its README section).
"""

import asyncio
import os
import signal
import socket
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
    reward, reason = code_reward(WRONG_ADD, ADD_TESTS)
    assert reward == 0.0 and "AssertionError" in reason


# -------------------------------------------------------------- rewards the policy cannot game

GAMES = {
    "os._exit(0) before the tests": "import os\nos._exit(0)",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)",
    "raise SystemExit": "raise SystemExit(0)",
    "atexit hook that exits 0": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG_ADD,
    "exception hook": "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n" + WRONG_ADD,
    "kill itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "object equal to everything": (
        "class Any:\n    def __eq__(self, other): return True\n    def __ne__(self, o): "
        "return False\ndef add(a, b):\n    return Any()"
    ),
    "int subclass equal to everything": (
        "class I(int):\n    def __eq__(self, other): return True\ndef add(a, b):\n    return I(0)"
    ),
    "patched builtins": (
        "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return a - b",
        "assert abs(add(1, 2) - 3) < 1e-9",
    ),
    "shadowed builtin used by the tests": (
        "def abs(x):\n    return 0\ndef add(a, b):\n    return a - b",
        "assert abs(add(1, 2) - 3) < 1e-9",
    ),
    "prints a fake success line": ("print('\\n@@slime-tests-passed ' + '0' * 32)\nimport os\nos._exit(0)"),
    "closes stdout": "import os\nos.close(1)\n" + WRONG_ADD,
    "redirects stdout": "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)\n" + WRONG_ADD,
    "rebinds the driver's helpers": (
        "import __main__\n__main__._equal = lambda a, b: True\n"
        "__main__._is_plain = lambda x: False\n__main__._BLOCKED_EVENTS = frozenset()\n"
        "class Any:\n    def __eq__(self, other): return True\n"
        "def add(a, b):\n    return Any()"
    ),
    "reads the token from the driver's frame": (
        "import sys, os\nf = sys._getframe()\nwhile f is not None:\n"
        "    if 'token' in f.f_locals:\n        os.write(1, b'\\n@@slime-tests-passed ' + f.f_locals['token'] + b'\\n'); os._exit(0)\n"
        "    f = f.f_back"
    ),
    "finds the token through a traceback": (
        "import os\ntry:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n"
        "    while f is not None:\n        tok = f.f_locals.get('token')\n"
        "        if tok: os.write(1, b'\\n@@slime-tests-passed ' + tok + b'\\n'); os._exit(0)\n        f = f.f_back"
    ),
    "scans the heap for the token": (
        "import gc, os, re\nfor o in gc.get_objects():\n    pass\nfor o in gc.get_referrers(os):\n    pass"
    ),
    "reads its own memory": "print(open('/proc/self/maps').read()[:10])",
    "ctypes": "import ctypes\nctypes.string_at(id(1), 8)",
    "starts a process": "import subprocess\nsubprocess.run(['true'])",
    "imports a module the driver did not": "import fractions, heapq\n" + WRONG_ADD,
    "inspect.stack() for the token": (
        "import inspect, os\nfor info in inspect.stack():\n    tok = info.frame.f_locals.get('token')\n"
        "    if tok: os.write(1, b'\\n@@slime-tests-passed ' + tok + b'\\n'); os._exit(0)"
    ),
    "code posing as the standard library": (
        "import os, sysconfig\nsrc = 'import sys\\ndef up():\\n    return sys._getframe(3)\\n'\n"
        "ns = {}\nexec(compile(src, sysconfig.get_paths()['stdlib'] + '/collections/x.py', 'exec'), ns)\n"
        "f = ns['up']()\nos._exit(0)"
    ),
    "reads stdin for the token": (
        "import sys, os\nt = sys.stdin.buffer.read()\n"
        "os.write(1, b'\\n@@slime-tests-passed ' + t + b'\\n'); os._exit(0)"
    ),
}


@needs_bwrap
@pytest.mark.parametrize("trick", list(GAMES))
def test_tricks_that_skip_or_fake_the_tests_score_zero(trick):
    """Each trick comes with a wrong solution: the reward is 0 unless the trick works."""
    program, tests = GAMES[trick] if isinstance(GAMES[trick], tuple) else (GAMES[trick], ADD_TESTS)
    reward, reason = code_reward(program, tests)
    assert reward == 0.0, (trick, reason)
    assert reason != "passed"


LEGIT = {
    "namedtuple, dataclass, enum, TypeVar": (
        "from collections import namedtuple, Counter, deque\nfrom dataclasses import dataclass\nimport enum, typing\n"
        "P = namedtuple('P', 'x y')\nT = typing.TypeVar('T')\nclass Color(enum.Enum):\n    RED = 1\n"
        "@dataclass\nclass Box:\n    v: int\n"
        "def add(a, b):\n    return Box(P(a, b).x).v + Counter([b])[b] * b + Color.RED.value - 1"
    ),
    "heapq, itertools, functools, re, fractions": (
        "import heapq, itertools, functools, re, fractions, math\n@functools.lru_cache(None)\n"
        "def add(a, b):\n    h = [a, b]; heapq.heapify(h)\n"
        "    return int(sum(itertools.chain(h)) + fractions.Fraction(0) + len(re.findall('z', 'x')) + math.floor(0))"
    ),
    "prints, catches its own exceptions, uses a class": (
        "class Adder:\n    def __call__(self, a, b):\n        try:\n            raise ValueError('x')\n"
        "        except ValueError:\n            print('handled')\n        return a + b\nadd = Adder()"
    ),
}


@needs_bwrap
@pytest.mark.parametrize("name", list(LEGIT))
def test_ordinary_solutions_pass_under_the_driver(name):
    assert code_reward(LEGIT[name], ADD_TESTS) == (1.0, "passed")


@needs_bwrap
def test_tests_may_use_classes_and_helpers_of_the_solution():
    program = (
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n"
        "    def pop(self):\n        return self.items.pop()\n"
    )
    tests = "s = Stack()\ns.push(1); s.push(2)\nassert s.pop() == 2\nassert s.items == [1]\nassert s.items != [2]"
    assert code_reward(program, tests) == (1.0, "passed")


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


def test_root_without_a_pids_cgroup_is_not_isolated(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only root is exempt from RLIMIT_NPROC")
    monkeypatch.setattr(sandbox_isolation, "_cgroup_parent", lambda: None)
    problem = sandbox_isolation.isolation_problem.__wrapped__()
    assert "pids cgroup" in problem
