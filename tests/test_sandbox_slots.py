"""The sandbox's uid range is checked against every range the host hands out (no root needed)."""

from __future__ import annotations

import pytest

from schedrl.sandbox import slots


def test_the_old_range_is_refused_for_systemds_dynamic_users_and_the_default_is_free(monkeypatch, tmp_path):
    real = slots.host_ranges
    monkeypatch.setattr(slots, "host_ranges", lambda: real(tmp_path))  # an empty /etc
    with pytest.raises(
        ValueError, match=r"sandbox uids 61000-65095 overlap systemd's dynamic service users \(61184-65519\)"
    ):
        slots.uid_range("61000-65095")
    assert slots.uid_range("") == slots.DEFAULT_UIDS == range(70000, 74096)


def test_login_defs_subuid_and_passwd_are_read(tmp_path):
    (tmp_path / "login.defs").write_text(
        "UID_MIN 2000\nUID_MAX 80000\n# SYS_UID_MIN 5\nSUB_UID_MIN 300000\nSUB_GID_MIN 300000\n"
    )
    (tmp_path / "subuid").write_text("alice:90000:65536\n")
    (tmp_path / "passwd").write_text("svc:x:75000:75000::/:/bin/false\n")
    (tmp_path / "group").write_text("builders:x:73000:\n")
    taken = slots.host_ranges(tmp_path)
    assert (2000, 80000, "login.defs UID_MIN..UID_MAX") in taken
    assert (300000, 600100000, "login.defs SUB_UID_MIN..SUB_UID_MAX") in taken  # the default MAX
    assert (101, 999, "login.defs SYS_UID_MIN..SYS_UID_MAX") in taken  # a commented line is not read
    assert slots.overlap(range(150000, 150010), taken) == "/etc/subuid line 1 (alice) (90000-155535)"
    assert slots.overlap(range(74000, 76000), [t for t in taken if "passwd" in t[2]]) == (
        "user 'svc' of /etc/passwd (75000-75000)"
    )
    groups = [t for t in taken if "/etc/group" in t[2]]
    assert slots.overlap(range(72000, 74000), groups) == "group 'builders' of /etc/group (73000-73000)"
    assert slots.overlap(range(160000, 170000), taken) == ""


def test_a_bad_range_is_refused_with_its_value():
    for bad in ("70000", "9-3", "0-5", "a-b"):
        with pytest.raises(ValueError, match=f"SCHEDRL_SANDBOX_UIDS must be FIRST-LAST .*got '{bad}'"):
            slots.uid_range(bad)


def test_the_sandbox_runs_where_ci_requires_it():
    """.ci/run installs what the sandbox needs: there the escape suite must run, not skip."""
    import os

    from sandbox_support import REASON

    if os.environ.get("SCHEDRL_REQUIRE_SANDBOX"):
        assert not REASON, REASON
