"""The cgroup layer's files, on a fake cgroupfs (no root needed): what each version writes to cap a run,
and where it reads the kernel's OOM count and peak. Real v1 runs are the escape suite's; these
machines mount the memory controller on v1 only, so v2 is checked here alone."""

from __future__ import annotations

from pathlib import Path

from schedrl.sandbox import cgroups


def test_v2_hands_the_controllers_down_and_caps_a_run(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids io\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    base = tmp_path / cgroups.BASE
    base.mkdir()
    (base / "cgroup.subtree_control").write_text("memory pids")
    h = cgroups._v2([(str(tmp_path), "cgroup2", set())])
    assert h == cgroups.Hierarchy(2, (base,))
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"  # the root's was empty
    assert (base / "cgroup.subtree_control").read_text() == "memory pids"  # already on: left alone
    (base / "run-1-0").mkdir()
    (base / "run-1-0" / "memory.swap.max").write_text("max")
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: None)  # the kernel would make it; made above
    run = h.create("run-1-0", 128 << 20, 16)
    d = base / "run-1-0"
    assert [
        (d / f).read_text() for f in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max")
    ] == [
        str(128 << 20),
        "0",
        "1",
        "16",
    ]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (d / "memory.peak").write_text("4096\n")
    assert (run.oom_kills(), run.memory_peak(), run.procs) == (2, 4096, (str(d / "cgroup.procs"),))


def test_v1_nests_under_the_callers_own_cgroups_and_reads_oom_control(tmp_path, monkeypatch):
    membership = tmp_path / "self-cgroup"
    membership.write_text("5:pids:/job\n4:memory:/job/trainer\n1:cpu:/\n")
    mem, pids = tmp_path / "memory", tmp_path / "pids"
    for d in (mem / "job" / "trainer", pids / "job"):
        d.mkdir(parents=True)
    mounts = [(str(mem), "cgroup", {"rw", "memory"}), (str(pids), "cgroup", {"rw", "pids"})]
    h = cgroups._v1(mounts, membership)
    assert h.bases == (mem / "job" / "trainer" / cgroups.BASE, pids / "job" / cgroups.BASE)
    for b in h.bases:
        (b / "r").mkdir()
    (h.bases[0] / "r" / "memory.memsw.limit_in_bytes").write_text("")
    (h.bases[0] / "r" / "memory.kmem.tcp.limit_in_bytes").write_text("")
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: None)
    run = h.create("r", 64 << 20, 8)
    m, p = (b / "r" for b in h.bases)
    assert (
        (m / "memory.limit_in_bytes").read_text()
        == (m / "memory.memsw.limit_in_bytes").read_text()
        == str(64 << 20)
    )
    assert (m / "memory.kmem.tcp.limit_in_bytes").read_text() == str(64 << 20)  # TCP buffers, apart
    assert (p / "pids.max").read_text() == "8"
    (m / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (m / "memory.max_usage_in_bytes").write_text("9000\n")
    assert (run.oom_kills(), run.memory_peak()) == (1, 9000)
