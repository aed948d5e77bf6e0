"""How the sandbox isolates a program: bubblewrap, a cgroup that bounds all its processes together, and the probe.

The sandboxed program runs under bubblewrap (`bwrap`, Debian's `bubblewrap` package) in new
user, mount, PID, network, IPC, UTS and cgroup namespaces, as user `nobody` with no capabilities,
`no_new_privs` and the seccomp filter of `seccomp`; it cannot create user namespaces
itself. Its root file system is an empty read-only tmpfs with only these mounted read-only:
`/usr` (and the `/bin`, `/lib*` links or directories), the Python installation that runs it, a
fresh `/proc` (its own processes only) and a minimal `/dev`. Its one writable place is
`/sandbox`, a tmpfs of `scratch_mb` (`/tmp` points there); nothing of the host (training data,
labels, checkpoints, the project, home directories, the host's /tmp) is visible, and nothing it
writes survives it. It has no network interface but its own loopback.

Memory and processes: every run gets its own cgroup (`SandboxCgroup`; cgroup v1's memory and pids
hierarchies, or one v2 directory), made under the caller's own cgroup where it can be, that bounds the
sandbox's processes *together*: their memory in all (with the tmpfs, memfd and shared-memory pages
they fill, and no swap) and how many processes and threads there are at once; past the memory, the
kernel's OOM killer ends one of them. Per-process rlimits alone (address space, RLIMIT_NPROC) are no
total bound: forked children each get the whole allowance, files in memory count against none, and a
process whose host user is root is exempt from RLIMIT_NPROC. Where no such cgroup can be made (not
root and no writable, delegated cgroup; the memory or pids controller missing), the sandbox counts as
not isolated (`isolation_problem`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from slime.sandbox.seccomp import seccomp_program

INSTALL_HINT = (
    "apt-get update && apt-get install -y bubblewrap   (Debian/Ubuntu; `bash scripts/setup.sh` does it as root)"
)
SCRATCH = "/sandbox"
SANDBOX_UID = 65534  # nobody


def python_paths() -> tuple[str, str]:
    """(interpreter, installation prefix) of the Python the sandbox runs: the base interpreter
    behind this process's (virtual) environment; a venv's packages are not shown to the program."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def _system_dirs() -> list[str]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def bwrap_command(
    argv: list[str], *, files: dict[str, int], scratch_mb: int, seccomp_fd: int | None, proc_fs: bool = True
) -> list[str]:
    """The bwrap command line that runs `argv` in `SCRATCH`; `files` maps a scratch file name to a
    readable fd whose content bwrap copies there. Without `proc_fs` there is no /proc at all."""
    _, prefix = python_paths()
    cmd = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        *_system_dirs(),
    ]
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        cmd += ["--ro-bind", prefix, prefix]
    if proc_fs:
        cmd += ["--proc", "/proc"]
    cmd += [
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--size",
        str(scratch_mb * 1024 * 1024),
        "--perms",
        "0777",
        "--tmpfs",
        SCRATCH,
        "--symlink",
        SCRATCH,
        "/tmp",
    ]
    for name, fd in files.items():
        cmd += ["--perms", "0644", "--file", str(fd), f"{SCRATCH}/{name}"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--remount-ro", "/", "--chdir", SCRATCH, "--", *argv]
    return cmd


# ------------------------------------------------------------------------ the sandbox's cgroup

_CONTROLLERS = ("memory", "pids")
CGROUP_PREFIX = "slime-sandbox-"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _unescape(field: str) -> str:
    """A /proc/self/mountinfo field, whose spaces and the like are octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(eq=False)
class _Hierarchy:
    mount: str  # its mount point
    own: str  # this process's cgroup in it: a directory under `mount`
    v2: bool
    controllers: list[str] = field(default_factory=list)  # of memory and pids, those it is used for


def _hierarchies() -> list[_Hierarchy]:
    """The cgroup hierarchies that provide memory and pids: for each controller a v1 hierarchy mounted
    with it, else the v2 one where it is available; a controller that neither provides is in none."""
    own: dict[str, str] = {}  # controller ("" for v2) -> this process's cgroup path
    for line in _read("/proc/self/cgroup").splitlines():
        hid, ctrls, path = line.split(":", 2)
        for c in [""] if hid == "0" and not ctrls else ctrls.split(","):
            own[c] = path
    v1: dict[str, _Hierarchy] = {}
    v2: _Hierarchy | None = None
    v2_available: list[str] = []
    for line in _read("/proc/self/mountinfo").splitlines():
        mount_part, _, fs_part = line.partition(" - ")
        fields, fs = mount_part.split(), fs_part.split()
        if len(fields) < 5 or len(fs) < 3 or fs[0] not in ("cgroup", "cgroup2"):
            continue
        ctrls = [c for c in _CONTROLLERS if c in fs[2].split(",")] if fs[0] == "cgroup" else [""]
        if not ctrls or ctrls[0] not in own:
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        rel = os.path.relpath(own[ctrls[0]], root)
        here = mount if rel.startswith("..") else os.path.normpath(os.path.join(mount, rel))  # unseen: the top
        hierarchy = _Hierarchy(mount, here, v2=fs[0] == "cgroup2")
        if not hierarchy.v2:
            for c in ctrls:
                v1.setdefault(c, hierarchy)
        elif v2 is None:
            try:
                v2_available = _read(os.path.join(mount, "cgroup.controllers")).split()
            except OSError:
                continue
            v2 = hierarchy
    found: list[_Hierarchy] = []
    for c in _CONTROLLERS:
        hierarchy = v1.get(c) or (v2 if c in v2_available else None)
        if hierarchy is not None:
            hierarchy.controllers.append(c)
            if hierarchy not in found:
                found.append(hierarchy)
    return found


def _v2_delegates(path: str, controllers: list[str]) -> bool:
    """Whether cgroup v2's `path` gives `controllers` to its children, enabling them if need be (which
    the kernel refuses where `path` itself holds processes: a child of its parent is tried then)."""
    try:
        if not set(controllers) <= set(_read(os.path.join(path, "cgroup.controllers")).split()):
            return False
        control = os.path.join(path, "cgroup.subtree_control")
        if not set(controllers) <= set(_read(control).split()):
            _write(control, " ".join(f"+{c}" for c in controllers))
        return set(controllers) <= set(_read(control).split())
    except OSError:
        return False


def _cgroup_parents() -> dict[str, tuple[bool, tuple[str, ...]]] | None:
    """Where a sandbox's cgroups can be made: directory -> (cgroup v2?, the controllers it is made for),
    memory and pids each exactly once; None where that cannot be. Each is made under this process's own
    cgroup, or the nearest ancestor that allows it, so that any bound on the caller holds the sandbox too."""
    try:
        hierarchies = _hierarchies()
    except OSError:
        return None
    parents: dict[str, tuple[bool, tuple[str, ...]]] = {}
    for h in hierarchies:
        path = h.own
        while path.startswith(h.mount):
            if os.access(path, os.W_OK) and (not h.v2 or _v2_delegates(path, h.controllers)):
                parents[path] = (h.v2, tuple(h.controllers))
                break
            if path == h.mount:
                break
            path = os.path.dirname(path)
    if sorted(c for _, controllers in parents.values() for c in controllers) != sorted(_CONTROLLERS):
        return None
    return parents


class SandboxCgroup:
    """One run's cgroup: all the sandbox's processes together get at most `memory_mb` of memory (with
    tmpfs, memfd and shared-memory pages they touch, and no swap) and `max_pids` processes and threads.
    Under cgroup v1 it is one directory in the memory and one in the pids hierarchy, under v2 one
    directory. `join()` runs in the child before exec; `close()` kills whatever is left in it and
    removes it (also when called twice)."""

    def __init__(self, memory_mb: int, max_pids: int):
        parents = _cgroup_parents()
        if parents is None:
            raise OSError(
                "no writable cgroup with the memory and pids controllers (cgroup v1: /sys/fs/cgroup/memory and "
                "/sys/fs/cgroup/pids; v2: both in cgroup.subtree_control)"
            )
        name = f"{CGROUP_PREFIX}{uuid.uuid4().hex[:12]}"
        memory = int(memory_mb) * 1024 * 1024
        self.dirs: list[str] = []
        self._memory: tuple[str, bool] | None = None
        try:
            for parent, (v2, controllers) in parents.items():
                path = os.path.join(parent, name)
                os.mkdir(path)
                self.dirs.append(path)
                if "memory" in controllers:
                    self._memory = (path, v2)
                    if v2:
                        _write(os.path.join(path, "memory.max"), str(memory))
                        swap = os.path.join(path, "memory.swap.max")  # absent without swap accounting
                    else:
                        _write(os.path.join(path, "memory.limit_in_bytes"), str(memory))
                        swap = os.path.join(path, "memory.memsw.limit_in_bytes")  # memory + swap; after the above
                    if os.path.exists(swap):
                        _write(swap, "0" if v2 else str(memory))
                if "pids" in controllers:
                    _write(os.path.join(path, "pids.max"), str(int(max_pids)))
        except OSError:
            self.close()
            raise
        self._procs = [os.path.join(path, "cgroup.procs") for path in self.dirs]

    def join(self) -> None:
        for procs in self._procs:
            _write(procs, "0")  # "0": the writing process itself

    def memory_limit_hit(self) -> bool:
        """Whether the kernel's OOM killer killed one of the sandbox's processes for the memory limit."""
        if self._memory is None:
            return False
        path, v2 = self._memory
        try:
            text = _read(os.path.join(path, "memory.events" if v2 else "memory.oom_control"))
            counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
            if "oom_kill" in counts:
                return int(counts["oom_kill"]) > 0
            return not v2 and int(_read(os.path.join(path, "memory.failcnt"))) > 0  # kernels before 4.13
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL to every process in the cgroup."""
        for path in self.dirs:
            try:  # cgroup v2 (Linux 5.14+): all at once, a process forking meanwhile too
                _write(os.path.join(path, "cgroup.kill"), "1")
                continue
            except OSError:
                pass
            try:
                pids = [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self, wait_s: float = 5.0) -> None:
        # a cgroup with processes (a killed one not yet reaped, too) cannot be removed (EBUSY): kill and retry
        deadline = time.monotonic() + wait_s
        while self.dirs:
            self.kill()
            path = self.dirs[-1]
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                # left for remove_stale_cgroups
            self.dirs.pop()


def remove_stale_cgroups(min_age_s: float = 300.0) -> None:
    """Empty sandbox cgroups left by callers that were killed (their `close()` never ran)."""
    for parent in _cgroup_parents() or {}:
        for path in Path(parent).glob(f"{CGROUP_PREFIX}*"):
            try:
                if time.time() - path.stat().st_mtime > min_age_s and not (path / "cgroup.procs").read_text().strip():
                    path.rmdir()
            except OSError:
                continue


# ----------------------------------------------------------------------------------------- probe


@lru_cache(maxsize=1)
def isolation_problem() -> str:
    """ "" when the bubblewrap sandbox works here (with its cgroup); else what is missing, in one line."""
    if shutil.which("bwrap") is None:
        return f"bubblewrap (`bwrap`) is not installed; install it with: {INSTALL_HINT}"
    remove_stale_cgroups()
    try:
        SandboxCgroup(64, 8).close()
    except OSError as e:
        return (
            f"the sandbox needs a writable memory+pids cgroup to bound all its processes together, and none can be "
            f"made here ({e}); run slime as root, or in a cgroup v2 subtree delegated to its user with the memory "
            f"and pids controllers (systemd: Delegate=yes)"
        )
    exe, _ = python_paths()
    program = seccomp_program()
    seccomp_fd = memfd("seccomp", program) if program is not None else None
    try:
        cmd = bwrap_command(
            [exe, "-I", "-S", "-c", "open('/sandbox/ok', 'w').write('1'); print(open('/sandbox/ok').read())"],
            files={},
            scratch_mb=1,
            seccomp_fd=seccomp_fd,
        )
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            pass_fds=() if seccomp_fd is None else (seccomp_fd,),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap could not be run: {e}"
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    if r.returncode != 0 or r.stdout.strip() != "1":
        detail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return (
            f"bubblewrap cannot make the sandbox here ({detail}); it needs unprivileged user namespaces "
            f"(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
        )
    return ""


def memfd(name: str, data: bytes) -> int:
    """A readable fd holding `data` from its start (bwrap copies files and reads filters from fds)."""
    try:
        fd = os.memfd_create(name, 0)
    except (AttributeError, OSError):  # no memfd: an unlinked temporary file does the same
        fd, path = tempfile.mkstemp(prefix="slime-sandbox-fd-")
        os.unlink(path)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
