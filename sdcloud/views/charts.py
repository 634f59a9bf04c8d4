"""The run page's charts: one SVG per series, drawn with matplotlib as the cost report draws its
charts (costs/html.py), text as paths so no font is needed.

Every point is one marker element (`<use>` in the SVG), so what a chart shows can be counted; the
events (reclaims, moves, checkpoints, ...) are vertical lines, which add no marker.
"""

from __future__ import annotations

import io

# Event marks: (label, colour) per group; page.py puts each event in one group.
EVENT_STYLE = {"reclaim": ("#d9534f", "--"), "move": ("#8e44ad", "-."), "checkpoint": ("#2e8b57", ":"),
               "health": ("#e67e22", "--"), "launch": ("#5b6b7f", ":"), "budget": ("#c0392b", "-"),
               "end": ("#1d2430", "-"), "other": ("#aaaaaa", ":")}

# (chart id, caption, metrics field, y label)
SERIES = (("loss", "Loss", "loss", "loss"),
          ("steps_per_s", "Steps per second", "steps_per_s", "steps/s"),
          ("gpu_util", "GPU use", "gpu_util", "% GPU"),
          ("mem_used", "GPU memory used", "mem_used", "MiB"),
          ("temp", "GPU temperature", "temp", "°C"),
          ("cost_usd", "Cost so far", "cost_usd", "USD"))


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def series_chart(points: list[tuple[float, float]], events: list[dict], ylabel: str,
                 smooth: list[tuple[float, float]] | None = None, gid: str = "points",
                 span: float | None = None) -> str:
    """points: (minutes since the run started, value), one marker each; smooth: a line without markers
    (the smoothed loss); gid: the id of the points' group; span: the x axis' end (minutes);
    events: {"minutes", "group"} drawn as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "path", "font.size": 8, "svg.hashsalt": "sdcloud"})
    fig, ax = plt.subplots(figsize=(5.2, 2.4))
    try:
        if points:
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, linewidth=1,
                              color="#2c6fbb")
            line.set_gid(gid)  # <g id=gid>: its <use> elements are the points
        if smooth:
            ax.plot([p[0] for p in smooth], [p[1] for p in smooth], linewidth=1.5, color="#f0ad4e")
        for ev in events:
            colour, style = EVENT_STYLE.get(ev["group"], ("#888888", ":"))
            ax.axvline(ev["minutes"], color=colour, linestyle=style, linewidth=1)
        if not points:
            ax.text(0.5, 0.5, "no points yet", transform=ax.transAxes, ha="center", va="center", color="#888888")
        if span:  # every chart of a page on the same axis, its points or not
            ax.set_xlim(-0.02 * span, span * 1.02)
        ax.set_xlabel("minutes since the run started")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        return _svg(fig)
    finally:
        plt.close(fig)
