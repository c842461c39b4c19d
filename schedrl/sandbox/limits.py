"""What a sandboxed run may use (`Limits`) and what it did (`SandboxResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Limits:
    """Each limit is enforced by the kernel: a cgroup for memory and processes, a tmpfs for disk,
    rlimits for CPU time, file size and open files, and a kill of the whole cgroup at the wall clock."""

    wall_s: float = 10.0  # wall clock, then every process of the run is killed
    cpu_s: int = 5  # RLIMIT_CPU, per process
    memory_mb: int = 512  # the run's memory cgroup: heap, page cache, tmpfs, shared memory and memfd
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 32  # the cgroup's pids.max (and RLIMIT_NPROC for its uid)
    output_bytes: int = 65536  # kept of stdout and of stderr each
    tmpfs_mb: int = 32  # total bytes the run may write: working directory, /tmp, /var/tmp, /dev/shm
    inodes: int = 4096  # total files and directories it may create there

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"Limits.{f.name} must be > 0, got {getattr(self, f.name)!r}")


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by the wall clock
    timed_out: bool
    oom: bool  # the kernel's out-of-memory killer ended a process of the run (its cgroup's count)
    wall_s: float
    truncated: bool = False  # stdout or stderr was cut at output_bytes
    signal: int | None = None  # the signal that ended it, if one did
    files: dict[str, bytes] = field(default_factory=dict)  # the `collect`ed files it left, if any
    memory_peak_mb: float = 0.0  # the cgroup's peak memory
    started: bool = True  # the sandbox's setup finished (False: it failed before the program ran)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
