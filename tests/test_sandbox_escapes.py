"""The escape suite: every attack is blocked and leaves nothing behind (no process, file, cgroup or mount).

It needs root (namespaces, cgroups, a uid switch), bubblewrap, keyutils and libseccomp; `Sandbox`
refuses to run without them, and these tests are skipped there with that reason. The attacks of
`test_sandbox_attacks.py` follow the issue that found them; these are the suite's first ones.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandbox_support import confined_box, needs_sandbox, run_unheard

from schedrl.sandbox import Limits, Sandbox, SandboxPool
from schedrl.sandbox.sandbox import BASE_DIR

pytestmark = [pytest.mark.sandbox, needs_sandbox]


box = confined_box(slot=41)


def test_a_plain_run_returns_output_exit_code_and_time(box):
    r = box.run(
        code="import sys; print('hi'); print('err', file=sys.stderr); sys.exit(3)", files={"a.txt": "x"}
    )
    assert (r.stdout, r.stderr.strip(), r.exit_code, r.timed_out, r.oom) == ("hi\n", "err", 3, False, False)
    assert r.wall_s < 5
    r = box.run(
        code="import os; print(os.getuid(), sorted(os.listdir('.')), open('a.txt').read())",
        files={"a.txt": "x"},
    )
    assert r.stdout.split(" ", 1)[0] == str(box.uid) and "['a.txt', 'main.py'] x" in r.stdout


def test_fork_bomb(box):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = box.run(code=code, limits=Limits(wall_s=3, processes=16, cpu_s=2))
    assert not r.ok


def test_double_forked_daemon_does_not_outlive_the_run(box):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    r = box.run(code=code, limits=Limits(wall_s=5))
    assert (
        r.stdout == "parent done\n" and r.wall_s < 4
    )  # the run ends with its first process; the fixture checks


def test_no_connection_to_a_listener_on_the_hosts_loopback(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
    )
    r = run_unheard(box, code, server)
    assert r.stdout.startswith("blocked")


def test_dns_lookup_fails(box):
    code = "import socket\ntry:\n    print(socket.getaddrinfo('example.com', 80))\nexcept OSError as e:\n    print('blocked')\n"
    assert box.run(code=code).stdout == "blocked\n"


def test_writes_outside_the_working_directory_and_symlink_escapes(box, tmp_path):
    code = (
        "import os\n"
        "for path in ['/run/schedrl-escape', '/etc/schedrl-escape', '/usr/schedrl-escape']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('blocked', path)\n"
        "open('/tmp/private', 'w').write('x'); print('tmp ok')\n"
        "os.symlink('/run', 'up')\n"
        "try:\n"
        "    open('up/schedrl-escape', 'w').write('x'); print('wrote via link')\n"
        "except OSError:\n"
        "    print('blocked link')\n"
        "os.symlink('/etc/shadow', 'shadow')\n"
        "try:\n"
        "    print(open('shadow').read()[:5])\n"
        "except OSError:\n"
        "    print('blocked shadow')\n"
    )
    r = box.run(code=code)
    assert "wrote" not in r.stdout.replace("wrote via", "") and "wrote via link" not in r.stdout, r.stdout
    assert r.stdout.count("blocked") == 5 and "tmp ok" in r.stdout
    for leftover in ("/run/schedrl-escape", "/etc/schedrl-escape", "/tmp/private"):
        assert not os.path.exists(leftover)  # the private /tmp was a tmpfs of the run's own


def test_secrets_of_the_host_stay_out_of_reach(box, monkeypatch):
    monkeypatch.setenv("SCHEDRL_SECRET", "hunter2")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "for path in ['/proc/1/environ', f'/proc/{os.getppid()}/environ', '/root']:\n"
        "    try:\n"
        "        data = open(path, 'rb').read() if not path.endswith('root') else os.listdir(path)\n"
        "        print(path, 'hunter2' in str(data))\n"
        "    except OSError:\n"
        "        print(path, 'blocked')\n"
        f"print(os.path.exists('/proc/{os.getpid()}'))\n"
    )
    r = box.run(code=code)
    assert "hunter2" not in r.stdout and "SCHEDRL_SECRET" not in r.stdout
    lines = r.stdout.splitlines()
    assert (
        set(eval(lines[0])) <= {"PATH", "LC_CTYPE", "PWD"}
        and "/root blocked" in lines
        and lines[-1] == "False"
    )  # host pids invisible
    assert all(line.endswith(("False", "blocked")) for line in lines[1:4])


def test_memory_cpu_and_wall_limits(box):
    big = box.run(code="x = bytearray(2 * 1024**3)\nprint('allocated')", limits=Limits(memory_mb=256))
    assert big.oom and "allocated" not in big.stdout
    busy = box.run(code="while True:\n    pass", limits=Limits(cpu_s=1, wall_s=20))
    assert not busy.ok and not busy.timed_out and busy.wall_s < 10  # RLIMIT_CPU, not the wall clock
    sleepy = box.run(code="import time\ntime.sleep(30)", limits=Limits(wall_s=1))
    assert sleepy.timed_out and sleepy.exit_code is None and sleepy.wall_s < 5


def test_file_size_open_files_and_an_output_flood(box):
    big = box.run(
        code="f = open('big', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * 1024 * 1024)\nprint('wrote 1 GB')",
        limits=Limits(file_mb=8),
    )
    assert "wrote 1 GB" not in big.stdout and not big.ok
    files = box.run(
        code="fs = []\ntry:\n    for i in range(100_000):\n        fs.append(open(f'f{i}', 'w'))\nexcept OSError:\n    print(len(fs))",
        limits=Limits(open_files=64),
    )
    assert int(files.stdout) < 64
    flood = box.run(
        code="import sys\nsys.stdout.write('x' * 100_000_000)", limits=Limits(output_bytes=4096, wall_s=20)
    )
    assert flood.truncated and len(flood.stdout) == 4096 and flood.wall_s < 15


def test_output_that_is_not_utf8_is_decoded_with_replacement(box):
    r = box.run(code="import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end')")
    assert r.stdout == "ok \ufffd\ufffd end"


def test_two_parallel_sandboxes_cannot_read_each_other(box):
    other = Sandbox(slot=42)
    holder = threading.Thread(
        target=other.run, kwargs={"code": "import time\ntime.sleep(3)", "files": {"secret.txt": "hunter2"}}
    )
    holder.start()
    try:
        deadline = time.time() + 5
        while time.time() < deadline and not list(
            (BASE_DIR / "runs").glob(f"run-{other.uid}-*/work/secret.txt")
        ):
            time.sleep(0.05)
        (secret,) = (BASE_DIR / "runs").glob(f"run-{other.uid}-*/work/secret.txt")
        code = (
            "import os\n"
            f"for path in [{str(secret)!r}, {str(secret.parent)!r}, {str(BASE_DIR)!r}]:\n"
            "    try:\n"
            "        print(open(path).read() if path.endswith('.txt') else os.listdir(path))\n"
            "    except OSError:\n"
            "        print('blocked')\n"
        )
        r = box.run(code=code)
    finally:
        holder.join()
        other.close()
    assert r.stdout.splitlines() == ["blocked", "blocked", "blocked"]


def test_a_setuid_binary_runs_as_the_sandbox_uid(tmp_path):
    suid = tmp_path / "id"
    shutil.copy("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    os.chmod(suid, 0o4755)
    os.chmod(tmp_path, 0o755)
    box = Sandbox(slot=45, expose=[str(tmp_path)])
    try:
        r = box.run(argv=[str(suid), "-u"])
    finally:
        box.close()
    assert r.stdout.strip() == str(box.uid)  # no_new_privs and nosuid: the setuid bit gives nothing


def test_ptrace_or_kill_of_a_host_process(box):
    victim = subprocess.Popen(["sleep", "30"])
    code = (
        "import ctypes, os, signal\n"
        "try:\n"
        f"    os.kill({victim.pid}, signal.SIGKILL); print('killed')\n"
        "except OSError as e:\n"
        "    print('kill blocked')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('ptrace', libc.ptrace(16, {victim.pid}, 0, 0))\n"  # PTRACE_ATTACH
    )
    try:
        r = box.run(code=code)
        assert victim.poll() is None, "the host process was killed"
    finally:
        victim.kill()
        victim.wait()
    assert r.stdout.splitlines() == ["kill blocked", "ptrace -1"]


def test_a_pool_runs_sandboxes_in_parallel_under_its_limit():
    pool = SandboxPool(size=2, limits=Limits(wall_s=10))
    start = time.perf_counter()
    threads = [
        threading.Thread(target=pool.run_sync, kwargs={"code": "import time\ntime.sleep(1)"})
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert pool.runs == 4 and 2.0 <= elapsed < 3.5  # two at a time: two rounds of one second


def test_bad_arguments_are_refused():
    box = Sandbox(slot=43)
    with pytest.raises(ValueError, match="code or argv, exactly one"):
        box.run()
    with pytest.raises(ValueError, match="file '../x' is outside the working directory"):
        box.run(code="pass", files={"../x": "y"})
    with pytest.raises(ValueError, match="collect takes plain file names, got '../x'"):
        box.run(code="pass", collect=["../x"])
    with pytest.raises(ValueError, match="Limits.wall_s must be > 0"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="Limits.inodes must be > 0, got -1"):
        Limits(inodes=-1)
    with pytest.raises(ValueError, match="'/proc/self' cannot be exposed"):
        Sandbox(slot=44, expose=["/proc/self"])
    with pytest.raises(ValueError, match="Sandbox.devices: '/etc/passwd' is not a device"):
        Sandbox(slot=44, devices=["/etc/passwd"])
    box.close()


def test_no_two_sandboxes_share_a_uid_across_processes():
    held = Sandbox(slot=44)
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "from schedrl.sandbox import Sandbox, SandboxUnavailable\n"
            "try:\n    Sandbox(slot=44)\nexcept SandboxUnavailable as e:\n    print('refused:', e)\n"
            f"print({held.uid} != Sandbox().uid)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.stdout.splitlines() == [
        f"refused: sandbox slot 44 (uid {held.uid}) is held by another sandbox",
        "True",
    ]
    held.close()
    again = Sandbox(slot=44)  # given back: free again
    assert again.uid == held.uid


def test_this_interpreter_runs_inside_with_its_packages_and_not_the_checkout_around_them():
    import schedrl

    checkout = Path(schedrl.__file__).resolve().parents[1]
    secret = checkout / f".env.schedrl-test-{os.getpid()}"  # a .env beside the trainer's script
    secret.write_text("TOKEN=hunter2\n")
    box = Sandbox(slot=46, python=sys.executable)
    code = (
        "import json, os, sys, schedrl\n"
        "def peek(path):\n"
        "    try:\n"
        "        return open(path).read()\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        f"print(json.dumps([os.getuid(), schedrl.__name__, sorted(os.listdir({str(checkout)!r})), peek({str(secret)!r})]))\n"
    )
    try:
        r = box.run(code=code)
        written = box.run(code="import sys\nopen(sys.prefix + '/x', 'w')")
    finally:
        secret.unlink()
        box.close()
    assert r.ok, r.stderr
    uid, name, listing, peeked = json.loads(r.stdout)
    assert (uid, name, peeked) == (box.uid, "schedrl", "FileNotFoundError")
    # only what the interpreter needs shows in the checkout: schedrl's source, and the virtual environment
    # where it lives inside it
    inside = {Path(sys.prefix).resolve()} if checkout in Path(sys.prefix).resolve().parents else set()
    assert set(listing) == {"schedrl", *(p.relative_to(checkout).parts[0] for p in inside)}
    assert not written.ok and "Error" in written.stderr  # exposed read-only
