"""Two Ray nodes on this machine (a head and a worker, each started by the test with its own CPUs and a
`schedrl-node` label, loopback only): the engine runs on the head, the learner's two FSDP2 ranks on the
worker, in a placement group. The worker node is killed mid-run; the run stops naming the dead rank, and
once a worker node is back the run resumes from its last checkpoint with no sample lost or trained twice
(the pipeline's ledger of consumed groups says so)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
RAY = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
STORE = str(80 * 2**20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(*args: str, label: str) -> subprocess.Popen:
    """A Ray node in its own session (so the whole node can be killed), loopback only."""
    cmd = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--object-store-memory", STORE]
    cmd += ["--disable-usage-stats", "--labels", f"schedrl-node={label}", *args]
    # a killed node is declared dead after 3 missed 1 s health checks (not Ray's default 30 s)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    return subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _kill(node: subprocess.Popen) -> None:
    with __import__("contextlib").suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait(timeout=30)


def _wait_nodes(address: str, labels: set[str], timeout: float = 120.0) -> None:
    """Until the cluster's live nodes carry exactly `labels` (checked from a short-lived process)."""
    code = (
        f"import ray, json; ray.init(address={address!r}, log_to_driver=False, logging_level='ERROR'); "
        "print(json.dumps(sorted(n['Labels'].get('schedrl-node', '') for n in ray.nodes() if n['Alive'])))"
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
        if out.returncode == 0 and set(json.loads(out.stdout.strip().splitlines()[-1])) == labels:
            return
        time.sleep(2)
    raise AssertionError(f"the Ray nodes {sorted(labels)} did not come up")


@pytest.fixture
def cluster(monkeypatch, no_ray_cluster):
    """A head and a worker node of their own; the session's shared cluster is shut down first, so the run
    reaches this one by its address."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # its own temporary directory: a later ray.init() must not find this cluster as the machine's current one
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live under it
    head = _node(
        "--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false", "--temp-dir", temp,
        label="head",
    )  # fmt: skip
    nodes = {"head": head}

    def start_worker() -> None:
        _wait_nodes(address, {"head"})  # a killed worker node is declared dead first
        nodes["worker"] = _node("--address", address, "--num-cpus", "2", label="worker")
        _wait_nodes(address, {"head", "worker"})

    try:
        start_worker()
        yield address, nodes, start_worker
    finally:
        for node in nodes.values():
            _kill(node)
        import ray

        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.subprocess
@pytest.mark.train("two Ray nodes started, a run on them, the worker node killed and started again, a resume")
def test_learner_ranks_on_a_killed_node_resume_from_the_last_checkpoint(tmp_path, cluster):
    import schedrl
    from schedrl.distributed import WorkerDiedError

    address, nodes, start_worker = cluster
    cfg = {
        "steps": 4, "save_every": 2, "keep_last": None, "out_dir": str(tmp_path), "name": "nodes",
        "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
        "sft": {"steps": 20, "batch_size": 32, "lr": 1e-3},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "temperature": 1.2},
        "eval": {"tasks": 0}, "min_start_reward": 0.0,
        "pipeline": {
            "mode": "async", "backend": "ray", "ray_address": address,
            "engine_node": "head", "learner_node": "worker", "worker_timeout_s": 300,
        },
        "learner": {"parallel": "fsdp2", "ranks": 2},
        "logging": {"backends": ["jsonl"]},
    }  # fmt: skip
    run = tmp_path / "nodes"

    placed = {}

    def kill_worker_node(done, metrics):
        if done == 3:  # step 3 trained, not yet checkpointed: the worker node and both ranks go
            import ray
            from ray._private.state import actors  # the actor table (ray.util.state needs the dashboard)

            label = {n["NodeID"]: n["Labels"].get("schedrl-node") for n in ray.nodes() if n["Alive"]}
            for a in actors(actor_state_name="ALIVE").values():
                placed.setdefault(a["ActorClassName"], []).append(label[a["Address"]["NodeID"]])
            _kill(nodes["worker"])

    with pytest.raises(WorkerDiedError, match=r"learner (rank \d )?died|lost with the worker or node") as err:
        schedrl.train(cfg, on_step=kill_worker_node)
    print("the run stopped with:", err.value)
    assert placed["RankActor"] == ["worker", "worker"] and placed["EngineWorker"] == ["head"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    saved = json.loads((run / "checkpoints" / "step_000002" / "state.json").read_text())["pipeline"]
    start_worker()  # a node with the label again
    schedrl.train(resume=run)
    final = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())["pipeline"]
    consumed = final["consumed"]
    assert len(consumed) == len(set(consumed)) == 4 * 4  # every update's groups once, none twice
    assert consumed[: len(saved["consumed"])] == saved["consumed"]  # the resume continued the ledger
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert steps == [1, 2, 3, 4]
