"""The system calls a sandboxed run never needs, denied by a seccomp filter that libseccomp compiles.

libseccomp (the C library every distribution ships; called through ctypes, since its own Python
binding is built for the system interpreter only) resolves names to numbers, adds the architecture
check (a 32-bit `int 0x80` or x32 call kills the process rather than slip past the table) and emits
the BPF program. It is compiled once per process and handed to bubblewrap (`--seccomp FD`), which
loads it as its last step before it starts the run, so no extra process runs per sandbox.

Denied with EPERM: kernel keyrings (`keyctl`, `add_key`, `request_key`), io_uring, new namespaces
(`unshare`, `setns`, and `clone` with any CLONE_NEW* flag), `ptrace` and cross-process memory access,
`bpf`, `perf_event_open`, every mount call, and the administrative calls (modules, kexec, reboot,
swap, accounting, quotas, `userfaultfd`, file handles). `clone3` answers ENOSYS: its flags sit in
memory a filter cannot read, and C libraries fall back to `clone` on ENOSYS, which is checked.

Sockets: TCP (IPv4 and IPv6, on the run's own loopback) only. A pathname socket of the host (in an
exposed directory, say) is reachable from any network namespace, so `socket(AF_UNIX)` answers
EAFNOSUPPORT, as do vsock (it leaves the machine), netlink and every other family, and `socketpair`
makes connected stream and seqpacket pairs only (a datagram pair could be aimed at a path). UDP,
SCTP and the other protocols answer EPERM: their buffers, like netlink's, are charged to no v1
memory cgroup (TCP's are, to `kmem.tcp`). What that costs a run: syslog, UDP, netlink (the C
library then assumes both address families), and multiprocessing's forkserver and listeners; pipes,
`fork`, asyncio, `ProcessPoolExecutor` under fork and TCP servers on its own loopback work.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import tempfile
from pathlib import Path

DENIED = (
    *("keyctl", "add_key", "request_key"),  # kernel keyrings
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("unshare", "setns"),  # new namespaces (clone's flags are checked below)
    *("ptrace", "process_vm_readv", "process_vm_writev", "kcmp"),
    *("bpf", "perf_event_open"),
    *("mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr"),
    *("move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick"),
    *("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot"),
    *("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "uselib", "vhangup"),
    *("userfaultfd", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "fanotify_init"),
)
NEW_NAMESPACE_FLAGS = {  # <linux/sched.h>
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
AF_UNIX, AF_INET, AF_INET6, AF_MAX = 1, 2, 10, 64  # <linux/socket.h>; AF_MAX with room to spare
SOCKET_FAMILIES = (AF_INET, AF_INET6)
SOCK_STREAM, SOCK_DGRAM, SOCK_TYPE_MASK, IPPROTO_TCP = 1, 2, 0xF, 6
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ = 4, 6, 7


def SCMP_ACT_ERRNO(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class SeccompUnavailable(RuntimeError):
    """libseccomp is not installed, or would not build the filter."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [  # struct scmp_arg_cmp
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as err:
        raise SeccompUnavailable(f"the sandbox's seccomp filter needs libseccomp ({name}): {err}") from err
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_version.restype = ctypes.POINTER(ctypes.c_uint * 3)
    return lib


def compile_filter() -> bytes:
    """The BPF program (struct sock_filter[]) of the filter above, for the native architecture."""
    lib = _library()
    version = tuple(lib.seccomp_version().contents)
    if version < (2, 4, 0):  # 2.3's 64-bit comparisons were wrong (CVE-2019-9893)
        raise SeccompUnavailable(f"the sandbox needs libseccomp 2.4 or newer, found {version}")
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:

        def rule(action: int, name: str, *cmps: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a system call of this architecture (umount on x86_64 is umount2)
                return
            array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_rule_add({name}) failed: {os.strerror(-rc)}")

        for name in DENIED:
            rule(SCMP_ACT_ERRNO(errno.EPERM), name)
        for flag in NEW_NAMESPACE_FLAGS.values():  # clone(flags, ...): flags is argument 0 on x86_64
            rule(SCMP_ACT_ERRNO(errno.EPERM), "clone", _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        rule(SCMP_ACT_ERRNO(errno.ENOSYS), "clone3")
        # sockets: TCP over the run's own loopback only. Every other family answers EAFNOSUPPORT (a
        # pathname socket is reached through AF_UNIX whatever network namespace the run is in, vsock
        # leaves the machine, netlink's buffers are charged to no cgroup), and every other type or
        # protocol of IPv4 and IPv6 EPERM (UDP's and SCTP's buffers escape a v1 memory cgroup too)
        # the kernel reads a family as a 32-bit int, the filter sees the whole register: a family with
        # high bits set would match no rule below and still be the family of its low bits
        wide = _ArgCmp(0, SCMP_CMP_GT, 0xFFFFFFFF, 0)
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socket", wide)
        rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socketpair", wide)
        for family in range(AF_MAX):
            if family not in SOCKET_FAMILIES:
                rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socket", _ArgCmp(0, SCMP_CMP_EQ, family, 0))
        for family in SOCKET_FAMILIES:
            same = _ArgCmp(0, SCMP_CMP_EQ, family, 0)
            for kind in range(SOCK_TYPE_MASK + 1):
                if kind != SOCK_STREAM:
                    rule(
                        SCMP_ACT_ERRNO(errno.EPERM),
                        "socket",
                        same,
                        _ArgCmp(1, SCMP_CMP_MASKED_EQ, SOCK_TYPE_MASK, kind),
                    )
            for protocol in range(1, IPPROTO_TCP):  # 0 (the default) and TCP itself pass
                rule(SCMP_ACT_ERRNO(errno.EPERM), "socket", same, _ArgCmp(2, SCMP_CMP_EQ, protocol, 0))
            rule(SCMP_ACT_ERRNO(errno.EPERM), "socket", same, _ArgCmp(2, SCMP_CMP_GT, IPPROTO_TCP, 0))
        rule(
            SCMP_ACT_ERRNO(errno.EPERM),
            "socketpair",
            _ArgCmp(0, SCMP_CMP_EQ, AF_UNIX, 0),
            _ArgCmp(1, SCMP_CMP_MASKED_EQ, SOCK_TYPE_MASK, SOCK_DGRAM),
        )
        with tempfile.TemporaryFile() as f:
            rc = lib.seccomp_export_bpf(ctx, f.fileno())
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            f.seek(0)
            return f.read()
    finally:
        lib.seccomp_release(ctx)


_PATH: Path | None = None


def filter_file(directory: Path) -> Path:
    """The compiled filter, written once per process into `directory` (root's): bubblewrap reads it from
    a descriptor opened per run."""
    global _PATH
    if _PATH is None or not _PATH.exists():
        program = compile_filter()
        path = directory / f"seccomp-{hashlib.sha256(program).hexdigest()[:16]}.bpf"
        if not path.exists():
            tmp = directory / f".{path.name}.{os.getpid()}"
            tmp.write_bytes(program)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        _PATH = path
    return _PATH
