"""Where the pipeline's workers run: core lists per worker, shared cores when there are too few."""

import os

import pytest

from schedrl.distributed.backend import placement, worker_name


@pytest.mark.parametrize(
    "cores, engines, engine_cpus, learner_cpus, expected",
    [
        ({0, 1}, 1, 1, 1, ([[0]], [1])),
        ({0, 1, 2, 3}, 2, 1, 2, ([[0], [1]], [2, 3])),
        ({2, 5, 7}, 1, 2, 1, ([[2, 5]], [7])),
        ({0, 1}, 2, 1, 1, ([None, None], None)),  # three workers on two cores: the OS shares them
        ({0, 1}, 1, 2, 2, ([None], None)),
    ],
)
def test_placement_gives_disjoint_cores_or_none(
    monkeypatch, cores, engines, engine_cpus, learner_cpus, expected
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cores), raising=False)
    assert placement(engines, engine_cpus, learner_cpus) == expected


def test_worker_names_number_engines_only_when_there_are_several():
    assert worker_name(0, 1) == "engine"
    assert [worker_name(i, 3) for i in range(3)] == ["engine-0", "engine-1", "engine-2"]
