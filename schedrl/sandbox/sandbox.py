"""Run untrusted code (model-written programs, their tests) confined, from what util-linux ships.

    result = Sandbox().run(code="print(1 + 1)", files={"data.txt": "42"}, limits=Limits(wall_s=5))
    result.stdout, result.exit_code, result.timed_out, result.oom, result.wall_s

Each run gets:

* its own network namespace (only a loopback that is down: no connection leaves it, not even to
  the host's loopback), PID namespace (it sees only its own processes; when its first process
  dies, every process in it is killed, so a daemon cannot outlive the run), IPC and UTS
  namespaces, and a mount namespace where /tmp, /var/tmp and /dev/shm are fresh, empty tmpfs;
* an unprivileged uid of its own (each `Sandbox` claims a free one with a lock file, so two runs at
  once, in one process or several, never share a uid: they cannot read each other's files, and
  `RLIMIT_NPROC` counts only its processes), no supplementary groups, no capabilities and
  `no_new_privs` (a setuid binary runs as the caller);
* rlimits on CPU seconds, address space, file size, open files, processes and core dumps;
* a wall-clock limit that kills the whole process group;
* an environment holding only `PATH`;
* a fresh working directory (mode 0700, its uid's), removed afterwards with everything in it;
* stdout and stderr capped in bytes (the rest is read and dropped, so a flood cannot block it).

`Sandbox(python=sys.executable)` runs this interpreter, with its packages, instead of the system
one: directories it needs that sit behind one the uid cannot enter (a virtual environment under
/root) are bound read-only into an otherwise empty tmpfs laid over that directory; `expose=` does
the same for other paths. `confine(argv)` gives the confined command line of a long-running
process (an MCP server) that the caller starts and talks to itself.

The chain is `unshare` (namespaces, mounts) -> `setpriv` (uid, groups, capabilities, no new
privileges) -> `prlimit` (rlimits) -> the program. It needs root to create the namespaces and switch
uid; without root, `Sandbox` raises `SandboxUnavailable` rather than run anything unconfined.

What it does not protect against: kernel exploits (it shares the host kernel; no seccomp filter
narrows the system calls), reading world-readable files of the host (the filesystem is the host's,
read-only where the uid lacks rights: /etc, /usr and the like are visible), exhausting memory below
the address-space limit times the number of concurrent runs, timing side channels, and anything
the uid is allowed to do inside its own working directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

BASE_DIR = Path("/run/schedrl-sandbox")  # 0711: a run can reach its own directory, not list the others
FIRST_UID = 61000  # sandbox uids: FIRST_UID + slot
NUM_SLOTS = 4096


class SandboxUnavailable(RuntimeError):
    """The machine cannot confine a run (no root, no namespaces); nothing was run."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock, then the whole process group is killed
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 512  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 32  # RLIMIT_NPROC, for its uid
    output_bytes: int = 65536  # kept of stdout and of stderr each
    tmpfs_mb: int = 16  # size of each fresh /tmp, /var/tmp, /dev/shm

    def __post_init__(self) -> None:
        for name in (
            "wall_s",
            "cpu_s",
            "memory_mb",
            "file_mb",
            "open_files",
            "processes",
            "output_bytes",
            "tmpfs_mb",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by the wall clock
    timed_out: bool
    oom: bool  # the program ran out of its address space (MemoryError, or killed by it)
    wall_s: float
    truncated: bool = False  # stdout or stderr was cut at output_bytes
    signal: int | None = None  # the signal that ended it, if one did

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"sandbox needs {name!r} (util-linux) on PATH")
    return path


def _check() -> tuple[str, str, str]:
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "sandbox needs root to create its namespaces and switch to an unprivileged uid "
            f"(running as uid {os.geteuid()}); nothing is run unconfined"
        )
    return _tool("unshare"), _tool("setpriv"), _tool("prlimit")


def unavailable_reason() -> str:
    """Why this machine cannot run sandboxes ("" when it can): what tests skip on."""
    try:
        _check()
    except SandboxUnavailable as err:
        return str(err)
    return ""


def interpreter_paths(python: str) -> list[str]:
    """What running `python` reads: for this interpreter, its prefixes, import path and schedrl's own
    source; for another, the installation the executable sits in."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        here = str(Path(__file__).resolve().parents[2])  # schedrl itself, an editable install's source too
        return sorted({sys.prefix, sys.base_prefix, here, *(p for p in sys.path if p and os.path.isdir(p))})
    return [str(Path(os.path.realpath(python)).parent.parent)]


class Sandbox:
    """Confined runs under a uid of their own: `slot` asks for one uid (an error if another holder has
    it), None takes the first free one. `close()` (or the end of the process) gives it back."""

    def __init__(
        self, slot: int | None = None, python: str | None = None, expose: Sequence[str] = ()
    ) -> None:
        self.unshare, self.setpriv, self.prlimit = _check()
        BASE_DIR.mkdir(mode=0o711, exist_ok=True)
        os.chmod(BASE_DIR, 0o711)
        (BASE_DIR / ".stage").mkdir(mode=0o700, exist_ok=True)  # each run mounts its own tmpfs here
        self.uid, self._lock = _claim_uid(slot)
        self._kill_uid()  # whatever a crashed earlier holder of this uid left running
        self.python = python or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
        paths = [*expose, *(interpreter_paths(self.python) if python else ())]
        self.exposed = _exposures(paths)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # the lock goes with the file description
            self._lock = None

    @contextlib.contextmanager
    def confine(
        self,
        argv: Sequence[str],
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Iterator[list[str]]:
        """The command line that runs `argv` confined, in a fresh working directory holding `files`, for a
        caller that starts the process and talks to it (over stdio) itself; there is no wall-clock limit
        but the caller's. `env` is added to its environment (PATH only otherwise). On exit every process of
        the uid is killed and the directory removed."""
        work = Path(tempfile.mkdtemp(prefix=f"run-{self.uid}-", dir=BASE_DIR))
        try:
            self._populate(work, files or {})
            yield self._command(work, list(argv), limits or Limits(), env or {})
        finally:
            self._kill_uid()
            shutil.rmtree(work, ignore_errors=True)

    def run(
        self,
        code: str | None = None,
        argv: Sequence[str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        stdin: str | bytes | None = None,
    ) -> SandboxResult:
        """Run `code` (Python source, as main.py) or `argv` in a fresh working directory holding `files`."""
        if (code is None) == (argv is None):
            raise ValueError("Sandbox.run takes code or argv, exactly one")
        lim = limits or Limits()
        work = Path(tempfile.mkdtemp(prefix=f"run-{self.uid}-", dir=BASE_DIR))
        try:
            self._populate(work, {**(files or {}), **({"main.py": code} if code is not None else {})})
            program = [self.python, "-I", "main.py"] if code is not None else list(argv or ())
            return self._execute(work, program, lim, stdin)
        finally:
            self._kill_uid()
            shutil.rmtree(work, ignore_errors=True)

    def _populate(self, work: Path, files: Mapping[str, str | bytes]) -> None:
        for name, content in files.items():
            path = (work / name).resolve()
            if work.resolve() not in path.parents:
                raise ValueError(f"Sandbox.run: file {name!r} is outside the working directory")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        for root, dirs, names in os.walk(work):
            for n in (*dirs, *names):
                os.lchown(os.path.join(root, n), self.uid, self.uid)
        os.chown(work, self.uid, self.uid)
        os.chmod(work, 0o700)

    def _command(self, work: Path, program: list[str], lim: Limits, env: Mapping[str, str] = {}) -> list[str]:
        mounts = _mount_script(self.exposed, f"size={lim.tmpfs_mb}m,mode=1777")
        mb = 1024 * 1024
        return [
            self.unshare, "--fork", "--pid", "--mount-proc", "--net", "--ipc", "--uts", "--kill-child",
            "/bin/sh", "-c", f'{" && ".join(mounts)} && cd "$0" && exec "$@"', str(work),
            self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all",
            "/usr/bin/env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", *(f"{k}={v}" for k, v in env.items()),
            self.prlimit, f"--cpu={lim.cpu_s}", f"--as={lim.memory_mb * mb}", f"--fsize={lim.file_mb * mb}",
            f"--nofile={lim.open_files}", f"--nproc={lim.processes}", "--core=0", "--",
            *program,
        ]  # fmt: skip

    def _execute(self, work: Path, program: list[str], lim: Limits, stdin) -> SandboxResult:
        start = time.perf_counter()
        proc = subprocess.Popen(
            self._command(work, program, lim),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
            start_new_session=True,  # its own process group, killed whole at the wall limit
        )
        out, err = _Capped(proc.stdout, lim.output_bytes), _Capped(proc.stderr, lim.output_bytes)
        if stdin is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin.encode() if isinstance(stdin, str) else stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        timed_out = False
        try:
            proc.wait(timeout=lim.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.join()
        err.join()
        wall = time.perf_counter() - start
        code = proc.returncode
        sig = -code if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
        stderr = err.text()
        oom = "MemoryError" in stderr or "Cannot allocate memory" in stderr
        return SandboxResult(
            out.text(),
            stderr,
            None if timed_out else code,
            timed_out,
            oom,
            wall,
            out.truncated or err.truncated,
            None if timed_out else sig,
        )

    def _kill_uid(self, wait_s: float = 5.0) -> None:
        """Kill anything left running as this slot's uid and wait until it is gone: the kernel kills a
        PID namespace's processes when its first one exits, but their exit takes a moment."""
        deadline = time.perf_counter() + wait_s
        while pids := self._uid_processes():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.perf_counter() > deadline:
                raise RuntimeError(f"sandbox uid {self.uid} still has processes {wait_s} s after its run")
            time.sleep(0.01)

    def _uid_processes(self) -> list[int]:
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == self.uid:
                        pids.append(int(entry.name))
                except OSError:  # exited while we looked
                    continue
        return pids


def _claim_uid(slot: int | None) -> tuple[int, IO[str] | None]:
    """A uid no other `Sandbox` on this machine holds, by an exclusive lock on its file in BASE_DIR."""
    for n in [slot] if slot is not None else range(NUM_SLOTS):
        if not 0 <= n < NUM_SLOTS:
            raise ValueError(f"Sandbox.slot must be in [0, {NUM_SLOTS}), got {n!r}")
        lock = open(BASE_DIR / f"uid-{FIRST_UID + n}.lock", "w")  # noqa: SIM115 -- held while the sandbox lives
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return FIRST_UID + n, lock
    if slot is not None:
        raise SandboxUnavailable(f"sandbox slot {slot} (uid {FIRST_UID + slot}) is held by another sandbox")
    raise SandboxUnavailable(f"all {NUM_SLOTS} sandbox uids are held")


MASKED = ("/tmp", "/var/tmp", "/dev/shm")  # a fresh, empty tmpfs in every run


@dataclass(frozen=True)
class Exposures:
    """Host paths a run sees read-only although it could not otherwise: `binds`, each under a directory
    its uid cannot enter (those are `hidden` behind an empty tmpfs) or under a masked one (/tmp, ...)."""

    binds: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()


def _exposures(paths: Sequence[str]) -> Exposures:
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    outer = [p for p in real if not any(p.startswith(q + "/") for q in real)]  # a path's parent covers it
    binds, hidden = [], set()
    for p in outer:
        blocked = next(
            (str(a) for a in reversed(Path(p).parents) if str(a) != "/" and not os.stat(a).st_mode & 1), None
        )
        masked = any(p.startswith(m + "/") for m in MASKED)
        if blocked is not None and blocked != p:
            hidden.add(blocked)
            binds.append(p)
        elif masked:
            binds.append(p)
    return Exposures(tuple(binds), tuple(sorted(hidden)))


def _mount_script(exposed: Exposures, tmpfs: str) -> list[str]:
    """Shell steps, as root in the run's mount namespace: bind each exposed path aside (in a tmpfs of the
    namespace's own, over BASE_DIR/.stage), mask /tmp, /var/tmp and /dev/shm and lay an empty tmpfs over
    each hidden directory, move the binds back to their own paths, and drop the staging tmpfs."""
    stage = shlex.quote(str(BASE_DIR / ".stage"))
    steps = [f"mount -t tmpfs -o size=1m,mode=700 tmpfs {stage}"] if exposed.binds else []
    for i, p in enumerate(exposed.binds):
        steps += [f"mkdir {stage}/{i}", f"mount --bind -o ro {shlex.quote(p)} {stage}/{i}"]
    steps += [f"mount -t tmpfs -o {tmpfs} tmpfs {d}" for d in MASKED]
    steps += [f"mount -t tmpfs -o size=1m,mode=755 tmpfs {shlex.quote(h)}" for h in exposed.hidden]
    for i, p in enumerate(exposed.binds):
        steps += [f"mkdir -p {shlex.quote(p)}", f"mount --move {stage}/{i} {shlex.quote(p)}"]
    if exposed.binds:
        steps.append(f"umount {stage}")
    return steps


@dataclass
class _Capped:
    """Reads a pipe to its end on a thread, keeping the first `cap` bytes."""

    pipe: object
    cap: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            chunk = self.pipe.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                break
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > max(room, 0):
                self.truncated = True

    def join(self) -> None:
        self.thread.join()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")  # non-UTF-8 output never raises
