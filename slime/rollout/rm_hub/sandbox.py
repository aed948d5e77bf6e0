"""Run untrusted Python in a throw-away process: no network, CPU / memory / wall-time limits.

`run_python(code, stdin=...)` writes `code` into a fresh temporary directory, runs it there with
the interpreter in isolated mode (`-I`: no user site, no PYTHON* variables) and a minimal
environment, and deletes the directory afterwards whatever happened. Limits:

* CPU time: `RLIMIT_CPU` (the kernel sends SIGXCPU, then SIGKILL);
* memory: `RLIMIT_AS` (allocations beyond it fail with MemoryError);
* wall time: the whole process group is killed (SIGKILL) when it runs past `timeout_s`;
* output: `RLIMIT_FSIZE` caps any file it writes, stdout/stderr are truncated when read;
* no core dumps; its own session, so every child it forks dies with it.

Isolation (`isolation()` says which level is in use):

* "namespaces" (root, or user namespaces allowed): new network, mount and PID namespaces.
  No network interfaces at all, not even loopback: it cannot reach the engine, the router or the
  internet. The whole file system is read-only except its working directory; /tmp, /var/tmp,
  /dev/shm, /home and /root are empty private tmpfs (only the interpreter's own directory is
  mounted back, read-only), so it can neither change nor leave anything outside its directory,
  nor read what other runs keep there. It sees only its own processes, so it cannot signal the
  trainer or the engines.
* "netns": only the network namespace could be made (the file system is as for the caller).
* "audit-hook": no namespaces; a guard installed before the user's code (a `sys.addaudithook`
  hook, which Python code cannot remove) refuses every socket connect/bind/send and `ctypes`/
  `_posixsubprocess` use, so it cannot open a socket or start a program that would.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

_GUARD = r'''
import sys as _sys
def _slime_sandbox_guard(event, args, _blocked=("socket.connect", "socket.bind", "socket.sendto",
        "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "_posixsubprocess.fork_exec", "os.system",
        "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn")):
    if event in _blocked:
        raise PermissionError("sandbox: " + event + " is not allowed")
_sys.addaudithook(_slime_sandbox_guard)
del _sys
'''

_RUNNER = r'''
import runpy, sys
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
'''


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed for the wall-time limit
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def reason(self) -> str:
        """One line: why the run did not succeed ("" when it did)."""
        if self.timed_out:
            return "wall-time limit"
        if self.returncode == 0:
            return ""
        if self.returncode is not None and self.returncode < 0:
            sig = -self.returncode
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            return f"killed by {name}" + (" (CPU-time limit)" if sig in (signal.SIGXCPU, signal.SIGKILL) else "")
        last = self.stderr.strip().splitlines()[-1:] or [f"exit status {self.returncode}"]
        return last[0][:300]


# Run inside the new mount namespace, before the user's code: $1 is the working directory, the
# other arguments directories to keep visible (the interpreter's), then "--" and the command.
_MOUNT_SCRIPT = r"""
set -e
work="$1"; shift
mount --make-rprivate /
mount --bind / / && mount -o remount,bind,ro /
mount --bind / /mnt
for d in /root /home /tmp /var/tmp /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o size=64m,mode=1777 tmpfs "$d"; fi
done
while [ "$1" != "--" ]; do
  mkdir -p "$1" && mount --bind "/mnt$1" "$1" && mount -o remount,bind,ro "$1"
  shift
done
shift
mkdir -p "$work" && mount --bind "/mnt$work" "$work" && mount -o remount,bind,rw "$work"
umount -l /mnt
cd "$work"
set +e
# Not exec: the shell stays PID 1 of the namespace (PID 1 is immune to default signal actions,
# so the program must not be it, or the CPU-time limit's SIGXCPU would be ignored); it reports
# how the program died on a marker line.
"$@"
status=$?
if [ $status -gt 128 ]; then echo "@@slime-sandbox-signal $((status - 128))" >&2; fi
exit $status
"""
_SIGNAL_MARKER = "@@slime-sandbox-signal "
_HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm")


def _kept_dirs() -> list[str]:
    """The interpreter's directories that lie under a directory the sandbox hides."""
    kept = []
    for d in dict.fromkeys(os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))):
        if any(d == h or d.startswith(h + "/") for h in _HIDDEN):
            kept.append(d)
    return kept


def _namespace_command(workdir: str, cmd: list[str]) -> list[str]:
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, "-n", "-m", "-p", "--fork", "--mount-proc", "--", "/bin/sh", "-c", _MOUNT_SCRIPT, "sandbox",
            workdir, *_kept_dirs(), "--", *cmd]


@lru_cache(maxsize=1)
def isolation() -> str:
    """'namespaces', 'netns' or 'audit-hook' (see the module docstring), probed once."""
    exe = shutil.which("unshare")
    if exe is None:
        return "audit-hook"
    probe = tempfile.mkdtemp(prefix="slime-sandbox-probe-")
    try:
        cmd = _namespace_command(probe, [sys.executable, "-I", "-c", "open('ok', 'w')"])
        r = subprocess.run(cmd, capture_output=True, timeout=20)
        if r.returncode == 0 and os.path.exists(os.path.join(probe, "ok")):
            return "namespaces"
        r = subprocess.run([exe, "-n", "--", "true"], capture_output=True, timeout=10)
        return "netns" if r.returncode == 0 else "audit-hook"
    except (OSError, subprocess.SubprocessError):
        return "audit-hook"
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def network_isolation() -> str:
    """'netns' (a network namespace: no interfaces) or 'audit-hook' (sockets refused in Python)."""
    return "audit-hook" if isolation() == "audit-hook" else "netns"


def _limits(cpu_s: float, memory_mb: int, file_mb: int):
    def apply() -> None:
        cpu = max(1, int(round(cpu_s)))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        mem = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        size = int(file_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_python(code: str, *, stdin: str = "", timeout_s: float = 10.0, cpu_s: float = 5.0,
               memory_mb: int = 1024, file_mb: int = 16, max_output: int = 1 << 20,
               files: dict[str, str] | None = None, python: str | None = None) -> SandboxResult:
    """Run `code` as `main.py` in a fresh temporary directory under the limits above."""
    workdir = tempfile.mkdtemp(prefix="slime-sandbox-")
    try:
        for name, text in {"main.py": code, **(files or {})}.items():
            path = os.path.join(workdir, name)
            if os.path.dirname(os.path.abspath(path)) != workdir:
                raise ValueError(f"sandbox file name {name!r} must be a plain file name")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        level = isolation()
        runner = _GUARD + _RUNNER if level == "audit-hook" else _RUNNER
        with open(os.path.join(workdir, "_sandbox_runner.py"), "w", encoding="utf-8") as f:
            f.write(runner)
        cmd = [python or sys.executable, "-I", "-B", "_sandbox_runner.py"]
        if level == "namespaces":
            cmd = _namespace_command(workdir, cmd)
        elif level == "netns":
            cmd = [shutil.which("unshare") or "unshare", "-n", "--", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_limits(cpu_s, memory_mb, file_mb))
        timed_out = False
        try:
            out, err = proc.communicate(stdin.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        finally:
            _kill_group(proc)  # anything it left running in its session goes too
        returncode = proc.returncode
        stderr = err[:max_output].decode("utf-8", "replace")
        head, marker, sig = stderr.rpartition(_SIGNAL_MARKER)
        if marker and sig.strip().isdigit():  # killed by a signal inside the namespace
            returncode, stderr = -int(sig.strip()), head
        return SandboxResult(
            returncode=None if timed_out else returncode,
            stdout=out[:max_output].decode("utf-8", "replace"),
            stderr=stderr,
            timed_out=timed_out,
            wall_s=time.monotonic() - t0,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
