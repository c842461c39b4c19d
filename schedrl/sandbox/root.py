"""The root a run sees, built from an allow-list: read-only system directories, a few files of /etc, a
fresh /proc and a minimal /dev, the interpreter with its packages, and one tmpfs of the run's own for
its working directory, /tmp, /var/tmp and /dev/shm. Nothing else of the host exists there: not /run
(its locks and sockets), /dev/log, /sys, /home, /root, /var, nor the directory the trainer runs from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

WORKDIR = "/sandbox"  # the run's working directory, inside
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (  # what the dynamic loader, the C library's time and the system Python read
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "python3",
    *(f"python3.{minor}" for minor in range(6, 20)),
)
GPU_DEVICES = ("nvidia", "dri", "kfd", "accel")  # what `devices="gpu"` looks for under /dev


def system_binds() -> list[str]:
    """bubblewrap arguments for the read-only system: a merged /usr's links as links, real directories
    bound read-only."""
    args = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def etc_files(uid: int) -> dict[str, str]:
    """Files of /etc made for the run rather than the host's: its own user, its own loopback name."""
    return {
        "passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::{WORKDIR}:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }


def interpreter_paths(python: str) -> list[str]:
    """What running `python` needs: for this interpreter, its prefixes, the site-packages on its path and
    the source of packages installed in editable mode (never the trainer's script directory or the
    checkout around them); for another, the installation its executable sits in."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return [str(Path(os.path.realpath(python)).parent.parent)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = set(prefixes)
    for p in sys.path:
        if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p):
            paths.add(p)
    for name, module in list(sys.modules.items()):  # setuptools' editable finders map a package to its source
        if name.startswith("__editable__") and isinstance(getattr(module, "MAPPING", None), dict):
            paths |= {str(v) for v in module.MAPPING.values() if os.path.isdir(str(v))}
    paths.add(
        str(Path(__file__).resolve().parents[1])
    )  # schedrl's own source: a server may be `-m schedrl...`
    return sorted(paths)


def exposure_binds(paths: Sequence[str]) -> list[str]:
    """bubblewrap arguments binding each host path read-only at its own place (one bind for a path and
    the paths under it)."""
    for given in paths:
        p = os.path.realpath(given)
        if p in ("/", WORKDIR) or p.startswith((WORKDIR + "/", "/proc", "/dev/")):
            raise ValueError(f"Sandbox.expose: {given!r} cannot be exposed (the run has its own {p!r})")
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    outer = [p for p in real if not any(p.startswith(q + "/") for q in real)]
    return [*_parents(outer), *(a for p in outer for a in ("--ro-bind", p, p))]


def _parents(paths: Sequence[str]) -> list[str]:
    """bubblewrap arguments making each path's missing parents 0755: left to itself, bubblewrap copies
    the host parent's mode, and a 0700 one (/root, /tmp/pytest-of-root) would shut the run out."""
    parents = sorted(
        {str(a) for p in paths for a in Path(p).parents if str(a) not in ("/", "/tmp", "/var", "/dev")}
    )
    return [a for d in parents for a in ("--perms", "0755", "--dir", d)]


def device_binds(devices: Sequence[str] | str) -> list[str]:
    """bubblewrap arguments for host devices a run may use: "gpu" (every GPU node), or paths. None by
    default: the run's /dev holds null, zero, full, random, urandom and tty only."""
    if devices == "gpu":
        devices = [f"/dev/{n}" for n in sorted(os.listdir("/dev")) if n.startswith(GPU_DEVICES)]
    elif isinstance(devices, str):
        raise ValueError(f"Sandbox.devices is 'gpu' or a list of /dev paths, got {devices!r}")
    args = []
    for d in devices:
        if not d.startswith("/dev/") or not os.path.exists(d):
            raise ValueError(f"Sandbox.devices: {d!r} is not a device under /dev")
        args += ["--dev-bind", d, d]
    return args
