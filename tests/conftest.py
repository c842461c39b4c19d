import gc
import os
import sys
import time

import pytest
import torch

from schedrl.models import TinyModelConfig, build_char_tokenizer, build_tiny_model

# One torch thread a test process: under pytest-xdist (scripts/test.sh runs two workers on two cores)
# each worker keeps a core, and a run's numbers do not depend on how many workers there are.
torch.set_num_threads(1)

# Tests that share something machine-wide run on one xdist worker (`--dist loadgroup`), one at a time:
# the Ray tests share the session's cluster; the sandbox tests claim uid slots and compare the host's
# mount table before and after a run.
GROUPED = ("ray", "sandbox")
RAY_CPUS = 4  # the shared cluster's logical CPUs: the largest placement a Ray test asks for
LONG_S = 30.0  # a test that takes longer carries `train` or `slow` with a reason


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = next((name for name in GROUPED if item.get_closest_marker(name)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        reason = next(
            (m.args[0] for m in map(item.get_closest_marker, ("train", "slow")) if m and m.args), None
        )
        if reason:  # carried on the test's reports, where the summary below reads it
            item.user_properties.append(("cost_reason", str(reason)))


def pytest_collection_finish(session):
    """Under `--dist loadgroup` xdist schedules a group by a suffix of its tests' ids; a pytest that drops
    it (pytest-xdist#1386) would run the groups' tests side by side, so such a run stops here."""
    if not getattr(session.config.option, "loadgroup", False):  # set on the workers of a loadgroup run
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the xdist groups of {len(lost)} tests, e.g. {lost[0]}"
        )


def pytest_terminal_summary(terminalreporter):
    """Name every test over `LONG_S` that does not say why: a `train` or `slow` marker with a reason."""
    unexplained = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if report.when != "call" or report.duration <= LONG_S:
            continue
        reasons = getattr(report, "user_properties", [])
        if not any(name == "cost_reason" and value for name, value in reasons):
            unexplained.append(f"{report.duration:6.1f}s {report.nodeid}")
    if unexplained:
        terminalreporter.write_sep("=", f"over {LONG_S:.0f} s without a train or slow reason")
        for line in unexplained:
            terminalreporter.write_line(line)


@pytest.fixture
def ray_cluster():
    """The session's local Ray cluster (`RAY_CPUS` CPUs, loopback, no dashboard, a small object store),
    started on first use and kept for the next Ray test; a run on it finds Ray initialised and leaves it
    up. After the test every CPU must be free again: the run let go of its actors."""
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if not ray.is_initialized():
        ray.init(
            num_cpus=RAY_CPUS,
            object_store_memory=100 * 2**20,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    gc.collect()  # actor handles the test dropped
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < RAY_CPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == RAY_CPUS, "the run left actors holding Ray CPUs"


@pytest.fixture
def no_ray_cluster():
    """No Ray in this process: the shared cluster (if up) is shut down, so a run starts its own (and must
    shut it down: checked after the test). The next `ray_cluster` user starts the shared one again."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield ray
    assert not ray.is_initialized(), "the pipeline left Ray running"


def pytest_sessionfinish(session):
    ray = sys.modules.get("ray")  # only where a test imported it
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


def peaked_model(tokenizer, seed):
    """A wide init makes logits peaked, so greedy argmax has clear margins and float
    noise between batched and unbatched kernels cannot flip a token. A larger eos
    embedding (tied to the output row) makes greedy outputs end at mixed lengths."""
    model = build_tiny_model(tokenizer, TinyModelConfig(initializer_range=0.2, seed=seed))
    with torch.no_grad():
        model.model.embed_tokens.weight[tokenizer.eos_token_id] *= 2.0
    return model


@pytest.fixture(scope="session")
def model(tokenizer):
    return peaked_model(tokenizer, seed=3)


@pytest.fixture(scope="session")
def other_model(tokenizer):
    return peaked_model(tokenizer, seed=2)


@pytest.fixture(scope="session")
def default_model(tokenizer):
    """The tiny model exactly as the factory builds it."""
    return build_tiny_model(tokenizer)
