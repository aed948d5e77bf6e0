"""Run untrusted Python (a policy's program, a tool call) in a sandbox, under limits.

    result = run_python(code, stdin="...", limits=SandboxLimits(timeout_s=5))

The isolation is bubblewrap's (see `bwrap`): new user/mount/PID/network namespaces,
user `nobody` without capabilities, a seccomp filter, a read-only root showing only `/usr` and the
Python installation, one scratch tmpfs (`/sandbox`, also `/tmp`) of `scratch_mb`, no network.
Limits, all in `SandboxLimits`:

* wall time `timeout_s`: past it the whole process tree is killed (`timed_out`);
* memory `memory_mb`: the total of all the sandbox's processes, with the tmpfs and memfd pages they
  fill and no swap (the run's cgroup; past it the kernel kills a process: `memory_limit`), and also
  each process's address space (RLIMIT_AS, so that one large allocation fails with MemoryError first);
* processes `processes`: the sandbox's processes and threads at once (the run's pids cgroup, and
  RLIMIT_NPROC inside the user namespace); `run_python(..., new_processes=False)` refuses new
  processes altogether, in the kernel (the seccomp filter), for programs that need none;
* CPU time `cpu_s` (RLIMIT_CPU per process: SIGXCPU, then SIGKILL), file size `file_mb`
  (RLIMIT_FSIZE), open files `open_files` (RLIMIT_NOFILE), scratch space `scratch_mb`; no core dumps;
* output: stdout and stderr are read while they stream, and a program that writes more than
  `max_output_kb` to either is killed (`output_limit`), so a flood never sits in memory whole.

The sandbox dies with its caller (bwrap's --die-with-parent), and nothing it wrote survives it.

Where bubblewrap cannot run (not installed, no user namespaces, no writable memory+pids cgroup),
`run_python` raises `SandboxUnavailable` naming what is missing and how to get it, unless
`allow_unisolated` (`--sandbox-allow-unisolated`): then the program runs as a plain child process
in a temporary directory under the same rlimits (and the cgroup, if one can be made), with an audit
hook refusing sockets, ctypes and new processes. That is not isolation (it can read and write what
the caller can); it is for trusted code on a machine without bubblewrap.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.errors import SlimeError
from slime.sandbox.bwrap import (
    SCRATCH,
    SandboxCgroup,
    bwrap_command,
    isolation_problem,
    memfd,
    python_paths,
)
from slime.sandbox.seccomp import seccomp_program


class SandboxUnavailable(SlimeError):
    """The isolated sandbox cannot run here (and unisolated runs were not allowed)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 1024
    file_mb: int = 16
    scratch_mb: int = 64
    processes: int = 32
    open_files: int = 64
    max_output_kb: int = 1024
    allow_unisolated: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "allow_unisolated" and not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"sandbox limit {f.name} must be a finite number > 0, got {value!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SandboxLimits:
        """The `--sandbox-*` options of a slime command line."""
        return cls(
            timeout_s=args.sandbox_timeout,
            cpu_s=args.sandbox_cpu_time,
            memory_mb=args.sandbox_memory_mb,
            file_mb=args.sandbox_file_mb,
            scratch_mb=args.sandbox_scratch_mb,
            processes=args.sandbox_processes,
            open_files=args.sandbox_open_files,
            max_output_kb=args.sandbox_max_output_kb,
            allow_unisolated=args.sandbox_allow_unisolated,
        )


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed for the wall-time or output limit
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    output_limit: bool = False
    memory_limit: bool = False  # the kernel killed a process for the memory limit of the whole sandbox

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_limit

    @property
    def reason(self) -> str:
        """One line: why the run did not succeed ("" when it did)."""
        if self.timed_out:
            return "wall-time limit"
        if self.output_limit:
            return "output limit"
        if self.returncode == 0:
            return ""
        if self.memory_limit:
            return "memory limit (all processes together)"
        sig = _signal_of(self.returncode)
        if sig is not None:
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            return f"killed by {name}" + (" (CPU-time limit)" if sig in (signal.SIGXCPU, signal.SIGKILL) else "")
        last = self.stderr.strip().splitlines()[-1:] or [f"exit status {self.returncode}"]
        return last[0][:300]


def _signal_of(returncode: int | None) -> int | None:
    """The signal that ended the program: negative for a direct child, 128+N as bwrap reports it."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def isolation() -> str:
    """'bwrap' when the isolated sandbox works here, else 'unisolated'."""
    return "unisolated" if isolation_problem() else "bwrap"


def check_sandbox(allow_unisolated: bool) -> None:
    """Stop before any work when the sandbox cannot be isolated and that was not explicitly allowed."""
    problem = isolation_problem()
    if problem and not allow_unisolated:
        raise SandboxUnavailable(
            f"the code sandbox cannot be isolated here: {problem}. Programs a policy writes must not run "
            f"unisolated; pass --sandbox-allow-unisolated only for trusted code on a machine without bubblewrap"
        )


# The first code that runs in the sandbox: the process limit (inside the user namespace it counts
# only the sandbox's processes), then the program as `__main__`, its directory importable.
_RUNNER = r"""
import resource, runpy, sys
n = int(sys.argv[1])
if n:
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
sys.argv = ["main.py"]
sys.path.insert(0, ".")
runpy.run_path("main.py", run_name="__main__")
"""

# Unisolated runs only: refuse sockets, ctypes and new processes in Python (an audit hook cannot be
# removed by Python code). It is not a sandbox; see the module docstring.
_GUARD = r"""
import sys as _sys
def _slime_guard(event, args, _blocked=frozenset(("socket.connect", "socket.bind", "socket.sendto",
        "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
        "_posixsubprocess.fork_exec", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "os.fork", "os.forkpty", "pty.spawn")), _denied=PermissionError):
    if event in _blocked or event.startswith("ctypes."):
        raise _denied("sandbox: " + event + " is not allowed")
_sys.addaudithook(_slime_guard)
del _sys
"""

# new_processes=False on a machine without the seccomp filter (not x86-64 or aarch64): refused in
# Python only, as for unisolated runs.
_NO_PROCESSES = r"""
import sys as _sys
def _slime_no_processes(event, args, _blocked=frozenset(("_posixsubprocess.fork_exec", "subprocess.Popen",
        "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn")), _denied=PermissionError):
    if event in _blocked:
        raise _denied("sandbox: " + event + " is not allowed")
_sys.addaudithook(_slime_no_processes)
del _sys
"""


_PR_SET_PDEATHSIG = 1


@lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _rlimits(limits: SandboxLimits, cgroup: SandboxCgroup | None):
    parent, libc = os.getpid(), _libc()

    def apply() -> None:  # in the child, before exec
        # Die with the caller even before bwrap's own --die-with-parent is set up (a caller killed
        # while the sandbox starts); the setting survives exec.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the caller died before the line above
            os._exit(1)
        if cgroup is not None:
            cgroup.join()
        cpu = max(1, int(round(limits.cpu_s)))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        # per process: one allocation too large fails with MemoryError rather than an OOM kill (the
        # cgroup bounds the total, which forked children and files in memory would walk around this)
        mem = int(limits.memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        size = int(limits.file_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(limits.open_files), int(limits.open_files)))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class _Capture:
    """Reads a pipe while it streams, keeping at most `cap` bytes; past that calls `overflow`."""

    def __init__(self, stream, cap: int, overflow):
        self.data = bytearray()
        self.exceeded = False
        self._thread = threading.Thread(target=self._read, args=(stream, cap, overflow), daemon=True)
        self._thread.start()

    def _read(self, stream, cap: int, overflow) -> None:
        fd = stream.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            room = cap - len(self.data)
            self.data += chunk[: max(room, 0)]
            if len(chunk) > room and not self.exceeded:
                self.exceeded = True
                overflow()
        stream.close()

    def text(self, timeout: float) -> str:
        self._thread.join(timeout)
        return self.data.decode("utf-8", "replace")


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except (BrokenPipeError, OSError):
        pass  # the program did not read all of it
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(
    cmd: list[str],
    *,
    cwd: str | None,
    stdin: bytes,
    limits: SandboxLimits,
    pass_fds: tuple[int, ...],
    cgroup: SandboxCgroup | None,
) -> SandboxResult:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": cwd or SCRATCH,
        "TMPDIR": cwd or SCRATCH,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=pass_fds,
        preexec_fn=_rlimits(limits, cgroup),
    )
    cap = int(limits.max_output_kb) * 1024
    out = _Capture(proc.stdout, cap, lambda: _kill_group(proc))
    err = _Capture(proc.stderr, cap, lambda: _kill_group(proc))
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = memory_limit = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc)  # bwrap goes, and with it (--die-with-parent) everything in the sandbox
        if cgroup is not None:
            cgroup.kill()  # anything left in the cgroup, also what left the session
        proc.wait()
        if cgroup is not None:
            memory_limit = cgroup.memory_limit_hit()
            cgroup.close()
    output_limit = out.exceeded or err.exceeded
    return SandboxResult(
        returncode=None if timed_out or output_limit else proc.returncode,
        stdout=out.text(5),
        stderr=err.text(5),
        timed_out=timed_out,
        wall_s=time.monotonic() - t0,
        output_limit=output_limit and not timed_out,
        memory_limit=memory_limit,
    )


def _check_names(files: dict[str, str]) -> None:
    for name in files:
        if not name or "/" in name or name in (".", "..") or name.startswith("."):
            raise ValueError(f"sandbox file name {name!r} must be a plain file name")


def _cgroup(limits: SandboxLimits) -> SandboxCgroup:
    return SandboxCgroup(int(limits.memory_mb), int(limits.processes) + 2)  # + bwrap and its init


def _run_isolated(
    files: dict[str, str], stdin: bytes, limits: SandboxLimits, proc_fs: bool, new_processes: bool
) -> SandboxResult:
    exe, _ = python_paths()
    program = seccomp_program(block_processes=not new_processes)
    if program is None and not new_processes:  # no filter for this machine: the audit hook at least
        files = {**files, "_sandbox_runner.py": _NO_PROCESSES + files["_sandbox_runner.py"]}
    fds: dict[str, int] = {name: memfd(name, text.encode("utf-8")) for name, text in files.items()}
    seccomp_fd = memfd("seccomp", program) if program is not None else None
    cgroup = None
    try:
        cgroup = _cgroup(limits)  # the probe made one, so this one is made too (or the run stops here)
        argv = [exe, "-I", "-B", "_sandbox_runner.py", str(int(limits.processes))]
        cmd = bwrap_command(argv, files=fds, scratch_mb=int(limits.scratch_mb), seccomp_fd=seccomp_fd, proc_fs=proc_fs)
        pass_fds = tuple(fds.values()) + (() if seccomp_fd is None else (seccomp_fd,))
        return _run(cmd, cwd=None, stdin=stdin, limits=limits, pass_fds=pass_fds, cgroup=cgroup)
    finally:
        if cgroup is not None:
            cgroup.close()
        for fd in [*fds.values(), *([] if seccomp_fd is None else [seccomp_fd])]:
            os.close(fd)


def _run_unisolated(files: dict[str, str], stdin: bytes, limits: SandboxLimits) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="slime-sandbox-")
    try:
        cgroup = _cgroup(limits)  # a total bound where one can be made all the same
    except OSError:
        cgroup = None
    try:
        files = {**files, "_sandbox_runner.py": _GUARD + files["_sandbox_runner.py"]}
        for name, text in files.items():
            Path(workdir, name).write_text(text, encoding="utf-8")
        # 0: no RLIMIT_NPROC, which outside a user namespace would count every process of this user
        cmd = [sys.executable, "-I", "-B", "_sandbox_runner.py", "0"]
        return _run(cmd, cwd=workdir, stdin=stdin, limits=limits, pass_fds=(), cgroup=cgroup)
    finally:
        if cgroup is not None:
            cgroup.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_python(
    code: str,
    *,
    stdin: str | bytes = "",
    files: dict[str, str] | None = None,
    limits: SandboxLimits | None = None,
    proc_fs: bool = True,
    new_processes: bool = True,
    **overrides: Any,
) -> SandboxResult:
    """Run `code` as `main.py` in the sandbox (with `files` next to it); `overrides` replace single
    limits (`timeout_s=`, `cpu_s=`, `memory_mb=`, ...). `proc_fs=False` mounts no /proc.
    `new_processes=False` makes the kernel refuse every new process (fork, vfork, posix_spawn,
    subprocess: PermissionError or another OSError; threads still work), for programs that have no
    business starting any, such as a solution under test; with the default, a program may start up to
    `processes` (a tool call running a shell command, say), all inside the sandbox's bounds."""
    limits = replace(limits or SandboxLimits(), **overrides)
    files = {**(files or {}), "main.py": code}
    _check_names(files)
    files["_sandbox_runner.py"] = _RUNNER
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    check_sandbox(limits.allow_unisolated)
    if isolation_problem():
        return _run_unisolated(files, data, limits)  # its audit hook refuses new processes anyway
    return _run_isolated(files, data, limits, proc_fs, new_processes)
