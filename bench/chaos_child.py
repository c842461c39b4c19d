"""`schedrl train` with the checkpoint protocol stopped by SIGKILL at one point of one save (for chaos.py).

    python bench/chaos_child.py POINT SAVE_NUMBER train RECIPE --set ...

POINT is one of `schedrl.training.checkpoint.POINTS` (written, synced, renamed, pointed); the kill
comes on the SAVE_NUMBER-th checkpoint this process writes. The learner writes checkpoints in this
process in the synchronous loop and on the threads backend (not on Ray, whose learner is an actor).
"""

from __future__ import annotations

import os
import signal
import sys

import schedrl.distributed.workers as workers
import schedrl.orchestrate.sync as sync
from schedrl.cli import main
from schedrl.training import checkpoint


def run() -> int:
    point, save_number, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if point not in checkpoint.POINTS:
        raise SystemExit(f"point must be one of {', '.join(checkpoint.POINTS)}, got {point!r}")
    real, saves = checkpoint.save_checkpoint, [0]

    def save(*args, **kwargs):
        saves[0] += 1
        if saves[0] == save_number:
            kwargs["at"] = lambda at: os.kill(os.getpid(), signal.SIGKILL) if at == point else None
        return real(*args, **kwargs)

    sync.save_checkpoint = save  # the modules that call it by name
    workers.save_checkpoint = save
    return main(argv)


if __name__ == "__main__":
    sys.exit(run())
