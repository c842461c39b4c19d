"""Run untrusted code (model-written programs, their tests) confined.

    result = Sandbox().run(code="print(1 + 1)", files={"data.txt": "42"}, limits=Limits(wall_s=5))
    result.stdout, result.exit_code, result.timed_out, result.oom, result.wall_s

Each run gets, from bubblewrap, util-linux and the kernel:

* a root built from an allow-list (`root.py`): read-only /usr and the loader's and Python's files of
  /etc, a fresh /proc, a /dev of null, zero, full, random, urandom and tty (no GPU unless `devices`
  names it), and one tmpfs of its own, capped in bytes and inodes, for its working directory
  (`/sandbox`), /tmp, /var/tmp and /dev/shm; the host's /run, /sys, /home, /root and sockets are not
  there;
* its own PID namespace (when its first process ends, every process in it is killed), network
  namespace (a loopback of its own; nothing leaves it), IPC, UTS and cgroup namespaces, and a new
  session (no terminal to push keystrokes into);
* a cgroup (`cgroups.py`) capping its memory (shared memory, memfd and TCP buffers included) and its
  processes;
  out-of-memory is the kernel's verdict (its OOM kills), not what the program printed; at `wall_s`
  every process in the cgroup is killed, whatever sessions or process groups it made;
* a seccomp filter (`seccomp.py`) denying keyrings, io_uring, new namespaces, ptrace, bpf,
  perf_event_open, mounts, and every socket but TCP; and a fresh, empty session keyring;
* an unprivileged uid of its own (`slots.py`: a range the host does not use, one uid per `Sandbox`),
  no groups, no capabilities, `no_new_privs`; rlimits on CPU seconds, file size, open files,
  processes and core dumps; an environment of `PATH` (and `env`, for `confine`) only;
* stdout and stderr capped in bytes (the rest is read and dropped), stdin written on a thread so a
  program that never reads it cannot hold up the clock.

The chain is `sh` (joins the run's cgroup, takes a new session keyring, opens the filter) ->
`setpriv --pdeathsig` (the run dies with its trainer) -> `unshare --pid` (reaps what follows) ->
`bwrap` (namespaces, the root, the seccomp filter; it reports to the host that the program started)
-> `setpriv` (uid, groups, capabilities, no new privileges) -> `prlimit` -> the program. It needs
root, bubblewrap, keyutils, libseccomp and a writable memory and pids cgroup; without any of them
`Sandbox` raises `SandboxUnavailable` rather than run anything less confined.

`Sandbox(python=sys.executable)` runs this interpreter with its packages (its prefixes, site-packages
and editable sources; not the trainer's directory); `expose=` binds other host paths read-only.
`confine(argv)` gives the confined command line of a long-running process (an MCP server) that the
caller starts and talks to itself.

What it does not protect against: kernel exploits through the system calls the filter allows (it
shares the host kernel), reading the world-readable files of the read-only system directories and of
exposed paths, timing and other side channels (CPU caches, /proc's global counters), and CPU time
beyond `cpu_s` per process times `processes`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from schedrl.sandbox import cgroups, root, seccomp, slots
from schedrl.sandbox.limits import Limits, SandboxResult
from schedrl.sandbox.workdir import WorkDir, remove_stale

BASE_DIR = Path("/run/schedrl-sandbox")  # root's, 0700: slots/, runs/, etc-<uid>/, the compiled filter
PATH = "/usr/local/bin:/usr/bin:/bin"
TOOLS = {
    "bwrap": "bubblewrap",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "prlimit": "util-linux",
    "keyctl": "keyutils",
}

__all__ = ["BASE_DIR", "Limits", "Sandbox", "SandboxResult", "SandboxUnavailable", "unavailable_reason"]


class SandboxUnavailable(RuntimeError):
    """The machine cannot confine a run (no root, a missing tool, no cgroup); nothing was run."""


def _tools() -> dict[str, str]:
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "sandbox needs root to create its namespaces, cgroups and mounts and switch to an "
            f"unprivileged uid (running as uid {os.geteuid()}); nothing is run less confined"
        )
    found = {}
    for name, package in TOOLS.items():
        path = shutil.which(name)
        if path is None:
            raise SandboxUnavailable(f"sandbox needs {name!r} on PATH (the {package} package)")
        found[name] = path
    return found


def unavailable_reason() -> str:
    """Why this machine cannot run sandboxes ("" when it can): what tests skip on."""
    try:
        Sandbox().close()  # the first one in a process runs a probe
    except (SandboxUnavailable, OSError) as err:
        return str(err)
    return ""


_PROBED = False


@dataclass
class _Space:
    """What one run holds: its tmpfs and its cgroup."""

    work: WorkDir
    cgroup: cgroups.RunCgroup


class Sandbox:
    """Confined runs under a uid of their own: `slot` asks for one uid (an error if another holder has
    it), None takes the first free one. `close()` (or the end of the process) gives it back.
    `devices`: host devices the runs may use ("gpu", or /dev paths); none by default."""

    def __init__(
        self,
        slot: int | None = None,
        python: str | None = None,
        expose: Sequence[str] = (),
        devices: Sequence[str] | str = (),
    ) -> None:
        self.tools = _tools()
        try:
            self.hierarchy = cgroups.hierarchy()
            for d in (BASE_DIR, BASE_DIR / "runs"):
                d.mkdir(mode=0o700, exist_ok=True)
                os.chmod(d, 0o700)
            self.filter = seccomp.filter_file(BASE_DIR)
        except (cgroups.CgroupUnavailable, seccomp.SeccompUnavailable) as err:
            raise SandboxUnavailable(str(err)) from err
        self.python = python or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
        paths = [*expose, *(root.interpreter_paths(self.python) if python else ())]
        self._exposed = [*root.exposure_binds(paths), *root.device_binds(devices)]  # over /tmp's too
        uids = slots.uid_range()
        claimed = slots.claim(BASE_DIR / "slots", uids, slot)
        if claimed is None:
            which = f"slot {slot} (uid {uids[slot]}) is" if slot is not None else f"all {len(uids)} uids are"
            raise SandboxUnavailable(f"sandbox {which} held by another sandbox")
        self.uid, self._lock = claimed
        self._runs = itertools.count()
        try:
            self._clean()
            self._system = [*root.system_binds(), *self._etc_binds()]
            self._probe()
        except BaseException:
            self.close()
            raise

    def _probe(self) -> None:
        """One confined run per process, so that a machine that cannot confine (no namespaces inside
        this container, a kernel without a feature) is refused here, with its reason, not run by run."""
        global _PROBED
        if _PROBED:
            return
        result = self.run(argv=["/bin/true"], limits=Limits(wall_s=30))
        if not result.ok:
            raise SandboxUnavailable(f"a confined run fails on this machine: {result.stderr.strip()[-500:]}")
        _PROBED = True

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # the lock goes with the file description
            self._lock = None

    def _clean(self) -> None:
        """Whatever an earlier holder of this uid that died mid-run left: its cgroups (and processes) and
        its tmpfs. A process of the uid outside them is not a sandbox's: the range is not free."""
        prefix = f"run-{self.uid}-"
        for stale in self.hierarchy.stale(prefix):
            stale.remove()
        remove_stale(BASE_DIR / "runs", prefix)
        if pids := live_processes(self.uid):
            raise SandboxUnavailable(
                f"uid {self.uid} has processes that are not a sandbox's ({pids[:5]}): set "
                "SCHEDRL_SANDBOX_UIDS=FIRST-LAST to a range the host does not use"
            )

    def _etc_binds(self) -> list[str]:
        etc = BASE_DIR / f"etc-{self.uid}"
        etc.mkdir(mode=0o700, exist_ok=True)
        args = []
        for name, text in root.etc_files(self.uid).items():
            (etc / name).write_text(text)
            args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
        return args

    @contextlib.contextmanager
    def _space(self, lim: Limits) -> Iterator[_Space]:
        name = f"run-{self.uid}-{next(self._runs)}"
        cgroup = self.hierarchy.create(name, lim.memory_mb * 1024 * 1024, lim.processes)
        try:
            work = WorkDir(BASE_DIR / "runs", f"{name}-", self.uid, lim.tmpfs_mb, lim.inodes)
        except BaseException:
            cgroup.remove()
            raise
        try:
            yield _Space(work, cgroup)
        finally:
            try:
                cgroup.kill()
            finally:
                try:
                    work.remove()
                finally:
                    cgroup.remove()

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
        but the caller's. Start it from a thread that outlives it: the run gets a parent-death signal,
        which the kernel sends when the thread that started it ends. `env` is added to its environment
        (PATH only otherwise). On exit every process of the run is killed and its directory removed."""
        lim = limits or Limits()
        with self._space(lim) as space:
            space.work.populate(files or {})
            yield self._command(space, list(argv), lim, env or {})

    def run(
        self,
        code: str | None = None,
        argv: Sequence[str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        stdin: str | bytes | None = None,
        collect: Sequence[str] = (),
    ) -> SandboxResult:
        """Run `code` (Python source, as main.py) or `argv` in a fresh working directory holding `files`;
        `collect` names files it may leave there to be returned in `result.files` (each at most
        `file_mb`, as the program could not write more)."""
        if (code is None) == (argv is None):
            raise ValueError("Sandbox.run takes code or argv, exactly one")
        lim = limits or Limits()
        with self._space(lim) as space:
            space.work.populate({**(files or {}), **({"main.py": code} if code is not None else {})})
            program = [self.python, "-I", "main.py"] if code is not None else list(argv or ())
            result = self._execute(space, program, lim, stdin)
            result.files = space.work.collect(collect, lim.file_mb * 1024 * 1024)
            return result

    def _command(self, space: _Space, program: list[str], lim: Limits, env: Mapping[str, str]) -> list[str]:
        joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in space.cgroup.procs)
        setup = (
            f"{{ {joins} && {shlex.quote(self.tools['keyctl'])} new_session >/dev/null 2>&1 && "
            f"exec 9< {shlex.quote(str(self.filter))} 8> {shlex.quote(str(space.work.status))}; }} || "
            '{ echo "schedrl sandbox: the run could not be set up" >&2; exit 125; }; exec "$@"'
        )
        work = space.work.path
        mb = 1024 * 1024
        return [
            "/bin/sh", "-c", setup, "sh",
            self.tools["setpriv"], "--pdeathsig=SIGKILL",
            self.tools["unshare"], "--pid", "--fork", "--kill-child",
            self.tools["bwrap"],
            "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup",
            "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
            "--seccomp", "9", "--json-status-fd", "8", "--clearenv", "--setenv", "PATH", PATH,
            *(a for k, v in env.items() for a in ("--setenv", k, v)),
            "--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/var",
            *self._system, "--proc", "/proc", "--dev", "/dev",
            "--bind", str(work / "work"), root.WORKDIR, "--bind", str(work / "tmp"), "/tmp",
            "--bind", str(work / "tmp"), "/var/tmp", "--bind", str(work / "shm"), "/dev/shm",
            *self._exposed,
            "--remount-ro", "/", "--chdir", root.WORKDIR, "--",
            self.tools["setpriv"], f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
            "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--pdeathsig=SIGKILL",
            self.tools["prlimit"], f"--cpu={lim.cpu_s}", f"--fsize={lim.file_mb * mb}",
            f"--nofile={lim.open_files}", f"--nproc={lim.processes}", "--core=0", "--",
            *program,
        ]  # fmt: skip

    def _execute(self, space: _Space, program: list[str], lim: Limits, stdin) -> SandboxResult:
        start = time.perf_counter()
        proc = subprocess.Popen(
            self._command(space, program, lim, {}),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": PATH},
            start_new_session=True,
        )
        out, err = _Capped(proc.stdout, lim.output_bytes), _Capped(proc.stderr, lim.output_bytes)
        if stdin is not None and proc.stdin is not None:
            _feed(proc.stdin, stdin.encode() if isinstance(stdin, str) else stdin)
        timed_out = not _exits_within(proc, lim.wall_s)
        if timed_out:
            space.cgroup.kill()
        proc.wait()
        space.cgroup.kill()  # on time or not: nothing of the run outlives its first process
        out.join(1.0)
        err.join(1.0)
        wall = time.perf_counter() - start
        code = proc.returncode
        oom = space.cgroup.oom_kills() > 0
        sig = -code if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
        return SandboxResult(
            out.text(),
            err.text(),
            None if timed_out else code,
            timed_out,
            oom,
            wall,
            out.truncated or err.truncated,
            None if timed_out else sig,
            memory_peak_mb=space.cgroup.memory_peak() / (1024 * 1024),
            started=timed_out or oom or space.work.exec_reported(),
        )


def live_processes(uid: int) -> list[int]:
    """Live processes of `uid` (a zombie, waiting for its parent to reap it, can do nothing)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and cgroups.proc_stat(entry.name)[:1] not in ([], ["Z"]):
                    pids.append(int(entry.name))
            except OSError:  # exited while we looked
                continue
    return pids


def _exits_within(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether `proc` ends within `timeout` seconds, woken by its pidfd the moment it does (Popen.wait
    polls, with sleeps that grow to 50 ms)."""
    fd = os.pidfd_open(proc.pid)
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write stdin on a thread: a program that never reads it must not hold up the wall clock."""

    def write() -> None:
        with contextlib.suppress(OSError):
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    threading.Thread(target=write, daemon=True).start()


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

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")  # non-UTF-8 output never raises
