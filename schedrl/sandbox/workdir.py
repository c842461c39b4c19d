"""A run's writable space: one tmpfs, capped in bytes and inodes, mounted on the host for the run's life.

It holds `work/` (the working directory, with the files given to the run), `tmp/` (its /tmp and
/var/tmp) and `shm/` (its /dev/shm), so one budget covers everything the run can write. It is removed
by a lazy unmount, which no tree shape (deep, wide, full of links) can slow or defeat; nothing the run
wrote is left on disk for a later run to read. Files the caller collects are opened without following
links or blocking on FIFOs, and only regular files are read.
"""

from __future__ import annotations

import ctypes
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class WorkDir:
    """The run's tmpfs at `path` (made under `parent`), owned by `uid`."""

    def __init__(self, parent: Path, prefix: str, uid: int, size_mb: int, inodes: int) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700,uid={uid},gid={uid}"
        try:
            _check(
                _libc.mount(b"tmpfs", bytes(self.path), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()),
                f"mount tmpfs on {self.path}",
            )
        except OSError:
            self.path.rmdir()
            raise
        self.uid = uid
        try:
            for d in ("work", "tmp", "shm"):
                (self.path / d).mkdir()
                os.chmod(self.path / d, 0o711 if d == "work" else 0o700)  # bubblewrap's --chdir, capless
                os.chown(self.path / d, uid, uid)
        except OSError:
            self.remove()
            raise

    @property
    def work(self) -> Path:
        return self.path / "work"

    @property
    def status(self) -> Path:
        """bubblewrap's JSON status (`--json-status-fd`), out of the run's reach (only `work/`, `tmp/` and
        `shm/` are bound into it)."""
        return self.path / "status"

    def exec_reported(self) -> bool:
        """Whether bubblewrap reported the program's exit, which it does only when its setup finished
        and the program's chain was executed; a run it killed (the wall clock) reports nothing."""
        try:
            return '"exit-code"' in self.status.read_text()
        except OSError:
            return False

    def populate(self, files: Mapping[str, str | bytes]) -> None:
        """Write `files` (relative paths) into the working directory, owned by the run's uid."""
        root = self.work.resolve()
        for name, content in files.items():
            path = (root / name).resolve()
            if root not in path.parents:
                raise ValueError(f"Sandbox.run: file {name!r} is outside the working directory")
            for parent in reversed(path.relative_to(root).parents[:-1]):
                if not (root / parent).exists():
                    (root / parent).mkdir()
                    os.chown(root / parent, self.uid, self.uid)
            # surrogatepass: a lone surrogate (text the caller did not choose) is written, not raised
            path.write_bytes(
                content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
            )
            os.chown(path, self.uid, self.uid)

    def collect(self, names: Sequence[str], cap: int) -> dict[str, bytes]:
        """The first `cap` bytes of each named regular file the run left in its working directory."""
        out = {}
        for name in names:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"Sandbox.run: collect takes plain file names, got {name!r}")
            try:
                fd = os.open(self.work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # absent, a link, or anything else that is not a file to read
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode):
                    with os.fdopen(os.dup(fd), "rb") as f:
                        out[name] = f.read(min(cap, info.st_size))
            finally:
                os.close(fd)
        return out

    def remove(self) -> None:
        _check(_libc.umount2(bytes(self.path), MNT_DETACH), f"umount {self.path}")
        self.path.rmdir()


def remove_stale(parent: Path, prefix: str) -> None:
    """Unmount and remove the tmpfs of runs named `prefix*` (left by a process that died mid-run)."""
    if not parent.is_dir():
        return
    for p in parent.iterdir():
        if p.name.startswith(prefix):
            if os.path.ismount(p):
                _check(_libc.umount2(bytes(p), MNT_DETACH), f"umount {p}")
            p.rmdir()
