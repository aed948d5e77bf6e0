"""How the sandbox isolates a program: bubblewrap, a pids cgroup when run as root, and the probe.

The sandboxed program runs under bubblewrap (`bwrap`, Debian's `bubblewrap` package) in new
user, mount, PID, network, IPC, UTS and cgroup namespaces, as user `nobody` with no capabilities,
`no_new_privs` and the seccomp filter of `seccomp`; it cannot create user namespaces
itself. Its root file system is an empty read-only tmpfs with only these mounted read-only:
`/usr` (and the `/bin`, `/lib*` links or directories), the Python installation that runs it, a
fresh `/proc` (its own processes only) and a minimal `/dev`. Its one writable place is
`/sandbox`, a tmpfs of `scratch_mb` (`/tmp` points there); nothing of the host (training data,
labels, checkpoints, the project, home directories, the host's /tmp) is visible, and nothing it
writes survives it. It has no network interface but its own loopback.

Processes: inside a user namespace, RLIMIT_NPROC counts only the sandbox's own processes, and
the runner sets it before the program starts. A process whose host user is root is exempt from
RLIMIT_NPROC, so when slime runs as root every sandbox also gets its own pids cgroup (v1 or v2)
with `pids.max`; without one, running as root, the sandbox has no process limit and counts as
not isolated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
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


# ----------------------------------------------------------------------------- pids cgroup (root)


def _cgroup_parent() -> str | None:
    """Where a sandbox's pids cgroup can be made: cgroup v1's pids hierarchy, or the v2 root."""
    if os.path.isfile("/sys/fs/cgroup/pids/cgroup.procs"):
        return "/sys/fs/cgroup/pids"
    controllers = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.isfile(controllers):
        try:
            with open(controllers) as f:
                if "pids" in f.read().split():
                    return "/sys/fs/cgroup"
        except OSError:
            return None
    return None


class PidsCgroup:
    """A fresh pids cgroup with `pids.max`; `join()` runs in the child before exec, `close()` kills
    whatever is still in it and removes it."""

    def __init__(self, max_pids: int):
        parent = _cgroup_parent()
        if parent is None:
            raise OSError("no pids cgroup hierarchy (/sys/fs/cgroup/pids or cgroup v2 with the pids controller)")
        self.path = os.path.join(parent, f"slime-sandbox-{uuid.uuid4().hex[:12]}")
        os.mkdir(self.path)
        try:
            with open(os.path.join(self.path, "pids.max"), "w") as f:
                f.write(str(max_pids))
        except OSError:
            os.rmdir(self.path)
            raise

    def join(self) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write("0")  # "0": the writing process itself

    def close(self) -> None:
        for _ in range(50):
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                return
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.02)


def remove_stale_cgroups(min_age_s: float = 300.0) -> None:
    """Empty sandbox cgroups left by callers that were killed (their `close()` never ran)."""
    parent = _cgroup_parent()
    if parent is None:
        return
    for path in Path(parent).glob("slime-sandbox-*"):
        try:
            if time.time() - path.stat().st_mtime > min_age_s and not (path / "cgroup.procs").read_text().strip():
                path.rmdir()
        except OSError:
            continue


def needs_pids_cgroup() -> bool:
    return os.geteuid() == 0


# ----------------------------------------------------------------------------------------- probe


@lru_cache(maxsize=1)
def isolation_problem() -> str:
    """ "" when the bubblewrap sandbox works here (with a process limit); else what is missing."""
    if shutil.which("bwrap") is None:
        return f"bubblewrap (`bwrap`) is not installed; install it with: {INSTALL_HINT}"
    if needs_pids_cgroup():
        remove_stale_cgroups()
        try:
            PidsCgroup(8).close()
        except OSError as e:
            return (
                f"running as root, the sandbox needs a pids cgroup for its process limit (root is exempt from "
                f"RLIMIT_NPROC), and none can be made: {e}"
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
