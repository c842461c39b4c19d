"""Sandbox uids: a range no one else on the host uses, one uid per `Sandbox`, claimed by a lock file.

The range is `DEFAULT_UIDS` unless `SCHEDRL_SANDBOX_UIDS=FIRST-LAST` says otherwise. It is refused when
it overlaps a range the host hands out (a run's gid is its uid, so group ranges count too):
`/etc/login.defs` (UID, SYS_UID, SUB_UID, GID, SYS_GID and SUB_GID ranges), `/etc/subuid`,
`/etc/subgid`, the ids in `/etc/passwd` and `/etc/group`, or the ranges systemd reserves
(homed users, nspawn's bound users, dynamic service users, nobody, container and foreign ranges).
The default, 70000..74095, sits above the 16-bit uids and below Debian's first subordinate uid.

Lock files are 0600 in a 0700 directory of root's, so a run (or another user) cannot take a slot's lock.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import IO

DEFAULT_UIDS = range(70000, 74096)
SYSTEMD_RANGES = (  # systemd's UIDS-GIDS.md
    (60001, 60513, "systemd-homed users"),
    (60514, 60577, "systemd-nspawn's bound host users"),
    (61184, 65519, "systemd's dynamic service users"),
    (65534, 65535, "nobody and the 16-bit -1"),
    (524288, 1879048191, "systemd's container uid ranges"),
    (2147352576, 2147418111, "systemd's foreign uid range"),
)


def uid_range(env: str | None = None) -> range:
    """The configured range (`SCHEDRL_SANDBOX_UIDS=FIRST-LAST`, inclusive), checked against the host's."""
    spec = os.environ.get("SCHEDRL_SANDBOX_UIDS", "") if env is None else env
    if not spec:
        uids = DEFAULT_UIDS
    else:
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", spec)
        if m is None or int(m[1]) > int(m[2]) or int(m[1]) == 0:
            raise ValueError(f"SCHEDRL_SANDBOX_UIDS must be FIRST-LAST with 0 < FIRST <= LAST, got {spec!r}")
        uids = range(int(m[1]), int(m[2]) + 1)
    if clash := overlap(uids, host_ranges()):
        raise ValueError(
            f"sandbox uids {uids.start}-{uids.stop - 1} overlap {clash}; "
            "set SCHEDRL_SANDBOX_UIDS=FIRST-LAST to a range the host does not use"
        )
    return uids


def overlap(uids: range, taken: list[tuple[int, int, str]]) -> str:
    """The first taken range (first, last, what) that `uids` overlaps, described; "" when none does."""
    for first, last, what in taken:
        if first <= uids.stop - 1 and uids.start <= last:
            return f"{what} ({first}-{last})"
    return ""


def host_ranges(etc: Path = Path("/etc")) -> list[tuple[int, int, str]]:
    """Every uid range this host uses or hands out, as (first, last, what)."""
    taken = list(SYSTEMD_RANGES)
    defs = _login_defs(etc / "login.defs")
    for key, default_first, default_last in (  # a run's gid is its uid: both kinds of range count
        ("UID", 1000, 60000),
        ("SYS_UID", 101, 999),
        ("SUB_UID", 100000, 600100000),
        ("GID", 1000, 60000),
        ("SYS_GID", 101, 999),
        ("SUB_GID", 100000, 600100000),
    ):
        first = defs.get(f"{key}_MIN", default_first)
        last = defs.get(f"{key}_MAX", default_last)
        taken.append((first, last, f"login.defs {key}_MIN..{key}_MAX"))
    for sub in ("subuid", "subgid"):
        for n, line in enumerate(_lines(etc / sub), 1):
            parts = line.split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                first = int(parts[1])
                taken.append((first, first + int(parts[2]) - 1, f"/etc/{sub} line {n} ({parts[0]})"))
    for table, what in (("passwd", "user"), ("group", "group")):
        for line in _lines(etc / table):
            parts = line.split(":")
            if len(parts) > 2 and parts[2].isdigit():
                taken.append((int(parts[2]), int(parts[2]), f"{what} {parts[0]!r} of /etc/{table}"))
    return taken


def _login_defs(path: Path) -> dict[str, int]:
    out = {}
    for line in _lines(path):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def claim(slots_dir: Path, uids: range, slot: int | None) -> tuple[int, IO[bytes]] | None:
    """Lock slot `slot` (or the first free one) and return (uid, the open lock); None when `slot` is held
    or, for None, when every slot is."""
    slots_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(slots_dir, 0o700)
    for n in [slot] if slot is not None else range(len(uids)):
        if not 0 <= n < len(uids):
            raise ValueError(f"Sandbox.slot must be in [0, {len(uids)}), got {n!r}")
        fd = os.open(slots_dir / f"uid-{uids[n]}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # a lock file left 0644 by an older version
        lock = os.fdopen(fd, "rb+", buffering=0)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return uids[n], lock
    return None
