"""A cgroup per sandboxed run: its memory (heap, page cache, tmpfs, System V and POSIX shared memory,
memfd) and its number of processes are the kernel's to cap, its out-of-memory kills the kernel's to
count, and every process in it is killed at once.

cgroup v2 where the unified hierarchy has the memory and pids controllers; v1 (the memory and pids
hierarchies) otherwise. v1 counts TCP buffers apart from memory (`kmem.tcp`): they get a limit of the
same size, so a run holds at most twice its memory limit there. Runs nest under the caller's own cgroup on v1 (what they use also counts
against the caller's limit); on v2 they sit under `schedrl-sandbox` at the hierarchy's root, the one
place a process-holding tree can hand controllers down. Neither writable: `CgroupUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

BASE = "schedrl-sandbox"


class CgroupUnavailable(RuntimeError):
    """No writable memory and pids cgroup on this machine."""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_field(path: Path, key: str) -> int:
    """`key N` from a flat keyed file (memory.events, memory.oom_control); 0 when absent."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def proc_stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state first, then the parent's pid);
    [] for a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[1]) if len(fields) > 1 else 0


@dataclass
class RunCgroup:
    """One run's cgroup: a directory per hierarchy (one on v2, memory and pids on v1)."""

    version: int
    dirs: tuple[Path, ...]  # memory's first

    @property
    def procs(self) -> tuple[str, ...]:
        """The files a process writes its pid to, to join the run (before it starts the program)."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                out |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return sorted(out)

    def kill(self, wait_s: float = 5.0) -> None:
        """SIGKILL every process in the run and wait until none is left. The run's PID namespace dies
        with its first process, so this ends even under a fork bomb. The tree's root (the caller's
        child, `unshare`) goes last: it reaps the namespace's first process and exits, where killed
        together that process would be left for the host's init to reap."""
        deadline = time.perf_counter() + wait_s
        spare_until = time.perf_counter() + min(0.5, wait_s)
        while pids := self.pids():
            inside = set(pids)
            if time.perf_counter() < spare_until:
                pids = [p for p in pids if _parent(p) in inside] or pids
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"sandbox cgroup {self.dirs[0]} still holds {pids} {wait_s} s after a kill"
                )
            time.sleep(0.002)

    def oom_kills(self) -> int:
        """How many processes of the run the kernel's OOM killer ended."""
        if self.version == 2:
            return _read_field(self.dirs[0] / "memory.events", "oom_kill")
        return _read_field(self.dirs[0] / "memory.oom_control", "oom_kill")

    def memory_peak(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return _read_int(self.dirs[0] / name)

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill what is left and remove the directories (a killed process leaves its cgroup a moment
        after it dies)."""
        self.kill(wait_s)
        deadline = time.perf_counter() + wait_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.perf_counter() > deadline:
                        raise
                    time.sleep(0.002)


@dataclass(frozen=True)
class Hierarchy:
    """Where runs' cgroups are made: `bases`, one per hierarchy (memory's first)."""

    version: int
    bases: tuple[Path, ...]

    def create(self, name: str, memory_bytes: int, processes: int) -> RunCgroup:
        dirs = tuple(b / name for b in self.bases)
        run = RunCgroup(self.version, dirs)
        try:
            for d in dirs:
                d.mkdir()
            mem, pids = dirs[0], dirs[-1]
            if self.version == 2:
                _write(mem / "memory.max", str(memory_bytes))
                if (mem / "memory.swap.max").exists():
                    _write(mem / "memory.swap.max", "0")
                _write(mem / "memory.oom.group", "1")
            else:
                _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # swap accounting is on: no swap either
                    _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
                if (mem / "memory.kmem.tcp.limit_in_bytes").exists():  # v1 counts TCP buffers apart
                    _write(mem / "memory.kmem.tcp.limit_in_bytes", str(memory_bytes))
            _write(pids / "pids.max", str(processes))
        except OSError:
            run.remove()
            raise
        return run

    def stale(self, prefix: str) -> list[RunCgroup]:
        """Runs' cgroups named `prefix*` (left by a process that died before cleaning up)."""
        names = sorted(
            {p.name for b in self.bases if b.is_dir() for p in b.iterdir() if p.name.startswith(prefix)}
        )
        return [RunCgroup(self.version, tuple(b / n for b in self.bases)) for n in names]


_HIERARCHY: Hierarchy | None = None


def hierarchy() -> Hierarchy:
    """This machine's hierarchy for runs, found and prepared once per process."""
    global _HIERARCHY
    if _HIERARCHY is None:
        mounts = _cgroup_mounts()
        errors = []
        for find in (_v2, _v1):
            try:
                _HIERARCHY = find(mounts)
                break
            except (OSError, CgroupUnavailable) as err:
                errors.append(str(err))
        else:
            raise CgroupUnavailable(
                "the sandbox needs a writable memory and pids cgroup (v2 with both controllers, or the "
                f"v1 memory and pids hierarchies): {'; '.join(errors)}"
            )
    return _HIERARCHY


def _cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of each cgroup filesystem."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], set(parts[3].split(","))))
    return out


def _v2(mounts: list[tuple[str, str, set[str]]]) -> Hierarchy:
    roots = [Path(m) for m, kind, _ in mounts if kind == "cgroup2"]
    if not roots:
        raise CgroupUnavailable("no cgroup2 mount")
    root = roots[0]
    have = set((root / "cgroup.controllers").read_text().split())
    if not {"memory", "pids"} <= have:
        raise CgroupUnavailable(f"cgroup2 at {root} lacks {sorted({'memory', 'pids'} - have)}")
    base = root / BASE
    base.mkdir(exist_ok=True)
    for d in (root, base):
        enabled = set((d / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            _write(d / "cgroup.subtree_control", "+memory +pids")
    return Hierarchy(2, (base,))


def _v1(mounts: list[tuple[str, str, set[str]]], membership: Path = Path("/proc/self/cgroup")) -> Hierarchy:
    own = {}
    for line in membership.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            own[c] = path.lstrip("/")
    bases = []
    for controller in ("memory", "pids"):
        points = [m for m, kind, opts in mounts if kind == "cgroup" and controller in opts]
        if not points:
            raise CgroupUnavailable(f"no cgroup v1 {controller} hierarchy")
        base = Path(points[0]) / own.get(controller, "") / BASE
        base.mkdir(exist_ok=True)
        bases.append(base)
    return Hierarchy(1, tuple(bases))
