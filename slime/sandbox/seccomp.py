"""A seccomp filter for the sandbox: the kernel interfaces sandboxed code has no use for, refused.

bubblewrap loads a compiled classic-BPF program from a file descriptor (`--seccomp FD`); this
module assembles one. It answers EPERM for the system calls below (the ones container escapes and
kernel exploits are built on: mounting, new namespaces, ptrace and cross-process memory, keyrings,
eBPF, perf, userfaultfd, io_uring, module and kexec loading, file handles) and for every call made
through another ABI than the machine's own (on x86-64, the 32-bit `int 0x80` and x32 entry points,
whose numbers differ and would walk around a list of 64-bit numbers). Everything else is allowed.
Known architectures: x86-64 and aarch64; elsewhere `seccomp_program()` is None and the sandbox runs
without the filter (the namespaces, read-only mounts and no capabilities still hold).
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: int nr; __u32 arch; ...
_NR, _ARCH = 0, 4
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_X32_BIT = 0x40000000

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
        },
    ),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter as bytes of `struct sock_filter` for this machine's architecture (None if unknown)."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    nrs = sorted({numbers[name] for name in _BLOCKED})
    prog = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ_K, 1, 0, audit_arch),  # own ABI: go on; any other: refused
        _insn(_RET_K, 0, 0, _RET_EPERM),
        _insn(_LD_W_ABS, 0, 0, _NR),
    ]
    if audit_arch == _ARCHES["x86_64"][0]:
        prog.append(_insn(_JGE_K, 0, 1, _X32_BIT))  # x32 numbers share the arch value
        prog.append(_insn(_RET_K, 0, 0, _RET_EPERM))
    for i, nr in enumerate(nrs):
        # on a match jump to the EPERM return after the list; else test the next number
        prog.append(_insn(_JEQ_K, len(nrs) - i, 0, nr))
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, _RET_EPERM))
    return b"".join(prog)
