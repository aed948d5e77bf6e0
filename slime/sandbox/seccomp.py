"""A seccomp filter for the sandbox: the kernel interfaces sandboxed code has no use for, refused.

bubblewrap loads a compiled classic-BPF program from a file descriptor (`--seccomp FD`); this
module assembles one. It answers EPERM for the system calls below (the ones container escapes and
kernel exploits are built on: mounting, new namespaces, ptrace and cross-process memory, keyrings,
eBPF, perf, userfaultfd, io_uring, module and kexec loading, file handles) and for every call made
through another ABI than the machine's own (on x86-64, the 32-bit `int 0x80` and x32 entry points,
whose numbers differ and would walk around a list of 64-bit numbers). Everything else is allowed.

With `block_processes`, it also refuses to create processes, for programs that have no business
starting any (a solution under test): `fork` and `vfork` answer EPERM, so does `clone` unless its
flags have CLONE_THREAD (a thread: threads still work), and `clone3` answers ENOSYS (its flags are
behind a pointer the filter cannot read; the C library then falls back to `clone`). `execve` stays
allowed: bubblewrap loads the filter right before it execs the program, and an exec is no new process.

Known architectures: x86-64 and aarch64; elsewhere `seccomp_program()` is None and the sandbox runs
without the filter (the namespaces, read-only mounts and no capabilities still hold).
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]. args[0]'s low
# 32 bits are at offset 16 on the little-endian machines below (clone's flags are its first argument
# on x86-64 and aarch64 alike).
_NR, _ARCH, _ARG0_LO = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_RET_ENOSYS = 0x00050000 | 38  # SECCOMP_RET_ERRNO | ENOSYS
_X32_BIT = 0x40000000
_CLONE_THREAD = 0x00010000

_BLOCKED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
    "fanotify_init",
    "lookup_dcookie",
)

# (AUDIT_ARCH_*, syscall numbers): from the kernel's syscall tables (arch/x86/entry/syscalls/
# syscall_64.tbl; include/uapi/asm-generic/unistd.h for aarch64).
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "unshare": 272,
            "setns": 308,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "move_mount": 429,
            "open_tree": 428,
            "mount_setattr": 442,
            "open_by_handle_at": 304,
            "name_to_handle_at": 303,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "acct": 163,
            "quotactl": 179,
            "syslog": 103,
            "vhangup": 153,
            "settimeofday": 164,
            "clock_settime": 227,
            "adjtimex": 159,
            "clock_adjtime": 305,
            "fanotify_init": 300,
            "lookup_dcookie": 212,
            "fork": 57,
            "vfork": 58,
            "clone": 56,
            "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "pidfd_getfd": 438,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "unshare": 97,
            "setns": 268,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "move_mount": 429,
            "open_tree": 428,
            "mount_setattr": 442,
            "open_by_handle_at": 265,
            "name_to_handle_at": 264,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "acct": 89,
            "quotactl": 60,
            "syslog": 116,
            "vhangup": 58,
            "settimeofday": 170,
            "clock_settime": 112,
            "adjtimex": 171,
            "clock_adjtime": 266,
            "fanotify_init": 262,
            "lookup_dcookie": 18,
            "clone": 220,  # no fork or vfork system calls on aarch64: the C library uses clone
            "clone3": 435,
        },
    ),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None, *, block_processes: bool = False) -> bytes | None:
    """The filter as bytes of `struct sock_filter` for this machine's architecture (None if unknown);
    `block_processes` also refuses new processes (threads stay allowed), see the module docstring."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    refused = set(_BLOCKED) | ({"fork", "vfork"} & numbers.keys() if block_processes else set())
    nrs = sorted({numbers[name] for name in refused})
    # (code, jt, jf, k) with jumps as labels ("allow", "eperm", "enosys") or 0 (the next instruction);
    # the labels are resolved to offsets once the program is laid out
    prog: list[tuple[int, int | str, int | str, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, audit_arch),  # own ABI: go on; any other: refused
        (_RET_K, 0, 0, _RET_EPERM),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if audit_arch == _ARCHES["x86_64"][0]:
        prog.append((_JGE_K, "eperm", 0, _X32_BIT))  # x32 numbers share the arch value
    prog += [(_JEQ_K, "eperm", 0, nr) for nr in nrs]
    if block_processes:
        prog += [
            (_JEQ_K, "enosys", 0, numbers["clone3"]),
            (_JEQ_K, 0, "allow", numbers["clone"]),
            (_LD_W_ABS, 0, 0, _ARG0_LO),
            (_JSET_K, "allow", "eperm", _CLONE_THREAD),  # a thread, not a process
        ]
    labels = {"allow": len(prog), "eperm": len(prog) + 1, "enosys": len(prog) + 2}
    prog += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_EPERM), (_RET_K, 0, 0, _RET_ENOSYS)]

    def offset(i: int, target: int | str) -> int:
        jump = target if isinstance(target, int) else labels[target] - i - 1
        assert 0 <= jump < 256, "a BPF conditional jump reaches at most 255 instructions"
        return jump

    return b"".join(_insn(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(prog))
