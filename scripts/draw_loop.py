"""Draw the loop and where each of the schedule's policies decides (docs/images/loop.svg).

`python scripts/draw_loop.py [OUT.svg]`. The boxes are the loop's stages (`schedrl/orchestrate/loop.py`);
each policy slot is labelled with its `schedule:` field, so the picture names every field of
`schedrl.orchestrate.schedule.POLICIES` and the staleness bound (a test checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "images" / "loop.svg"

# (x, y, text): the loop's stages, clockwise from the task source
STAGES = {
    "tasks": (1.2, 3.0, "tasks\n(train split)"),
    "buffer": (4.4, 3.0, "groups\n(G requests each)"),
    "engines": (8.0, 3.0, "engines\n(decode steps)"),
    "env": (12.0, 3.0, "environment\n(tools, sandbox)"),
    "score": (12.0, 0.8, "rewards and\nadvantages"),
    "learner": (8.0, 0.8, "learner\n(update)"),
}
# (x, y, schedule field, what it decides, the stage it acts on)
POLICIES = [
    (1.2, 4.4, "data", "which tasks, how many samples", "tasks"),
    (4.2, 4.4, "max_staleness", "k: may this group start yet?", "buffer"),
    (6.9, 4.4, "admission", "which request runs next", "engines"),
    (9.6, 4.4, "rollout", "plain, pruning, speculative", "engines"),
    (12.4, 4.4, "tool_wait", "what a waiting episode holds", "env"),
    (12.0, -0.6, "consumption", "which samples an update takes", "score"),
    (4.6, 0.8, "weight_sync", "when weights reach engines", "learner"),
]
ARROWS = [
    ("tasks", "buffer", ""),
    ("buffer", "engines", "admit"),
    ("engines", "env", "turn ends"),
    ("env", "score", "episode ends"),
    ("score", "learner", "batch"),
]


def _box(ax, x: float, y: float, text: str, color: str, width: float = 2.2, height: float = 0.9) -> None:
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.05",
            facecolor=color,
            edgecolor="#333333",
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax, a: tuple[float, float], b: tuple[float, float], label: str, rad: float = 0.0) -> None:
    ax.add_patch(
        FancyArrowPatch(
            a, b, arrowstyle="-|>", mutation_scale=14, color="#333333", connectionstyle=f"arc3,rad={rad}"
        )
    )
    if label:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, label, ha="center", fontsize=8, color="#555555")


def draw(out: Path = OUT) -> Path:
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and checked by the tests
    plt.rcParams["svg.hashsalt"] = "schedrl-loop"  # element ids from a fixed salt: the same file each time
    fig, ax = plt.subplots(figsize=(14, 6.4))
    for x, y, text in STAGES.values():
        _box(ax, x, y, text, "#e8eef7")
    for x, y, field, what, stage in POLICIES:
        _box(ax, x, y, f"schedule.{field}\n{what}", "#fff2cc", width=2.6, height=0.8)
        sx, sy = STAGES[stage][:2]
        ax.plot([x, sx], [y, sy], ":", color="#b58900", zorder=0)
    for a, b, label in ARROWS:
        (xa, ya, _), (xb, yb, _) = STAGES[a], STAGES[b]
        if ya == yb:
            sign = 1 if xb > xa else -1
            _arrow(ax, (xa + sign * 1.15, ya), (xb - sign * 1.15, yb), label)
        else:
            _arrow(ax, (xa, ya - 0.5), (xb, yb + 0.5), label)
    lx, ly = STAGES["learner"][:2]
    ex, ey = STAGES["engines"][:2]
    _arrow(ax, (lx - 0.4, ly + 0.5), (ex - 0.4, ey - 0.5), "new weights", rad=0.0)
    ax.text(
        0.0,
        -1.6,
        "Every policy is a registered name or pkg.module:Class with its own <policy>_args; the same\n"
        "schedule runs the synchronous loop, the asynchronous pipeline and the simulator (loop.py).",
        fontsize=8,
        color="#333333",
    )
    ax.set_xlim(-0.3, 14.0)
    ax.set_ylim(-1.8, 5.0)
    ax.set_axis_off()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
