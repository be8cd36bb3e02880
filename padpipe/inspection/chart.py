"""The ``inspect`` chart: the token-length histogram (log x) and the padding efficiency of every strategy.

Drawn with matplotlib's Agg renderer on a bare ``Figure`` (no display, no pyplot state); ``pip install padpipe[chart]``.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import numpy as np

from padpipe._optional import require
from padpipe.inspection.advice import Findings

BAR_COLOR = "#4C72B0"
BEST_COLOR = "#55A868"
LIMIT_COLOR = "#C44E52"


def write_chart(result: Findings, path: str | os.PathLike) -> str:
    """Write ``result``'s chart as a PNG to ``path`` and return the path.

    Raises:
        ImportError: matplotlib is not installed (the message names the extra).
        ValueError: ``result`` has no rows.
    """
    # a bare Figure renders with Agg; pyplot's global state is not touched
    Figure = require("matplotlib.figure", "inspect's chart").Figure
    if not result.rows:
        raise ValueError("inspect's chart needs at least one row, but the input has none.")
    figure = Figure(figsize=(13, 5.2), dpi=110, layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=(1, 1.15))
    _histogram(left, result)
    _efficiency(right, result)
    where = f"{result.rows:,} rows sampled of {result.corpus.rows:,}" if result.sampled else f"all {result.rows:,} rows"
    figure.suptitle(
        f"padpipe inspect: {os.path.basename(result.source.rstrip('/')) or result.source} ({where})",
        fontsize=13,
        fontweight="bold",
    )
    path = os.fspath(path)
    with open_new(path) as handle:
        figure.savefig(handle, format="png")
    return path


def open_new(path: str) -> BinaryIO:
    """``path`` opened for writing without following a symbolic link there (a planted link is an error).

    Example:
        >>> import tempfile; folder = tempfile.mkdtemp(); os.symlink("/etc/passwd", f"{folder}/c.png")
        >>> open_new(f"{folder}/c.png")
        Traceback (most recent call last):
        ...
        OSError: ... is a symbolic link; refusing to write the chart through it.
    """
    if os.path.islink(path):
        raise OSError(f"{path} is a symbolic link; refusing to write the chart through it.")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def _histogram(ax, result: Findings) -> None:
    lengths = result.lengths
    dist = result.distribution()
    low, high = max(1, int(lengths.min())), max(2, int(lengths.max()))
    # bins of whole lengths, about evenly spaced on the log axis; counts are scaled to the mean bin
    # width there, so bins that rounding made wider or narrower compare and area is rows
    edges = np.unique(np.geomspace(low, high + 1, 60).round()) - 0.5
    counts, _ = np.histogram(lengths, bins=edges)
    widths = np.diff(np.log(edges))
    heights = counts * widths.mean() / widths
    ax.stairs(heights, edges, fill=True, color=BAR_COLOR, alpha=0.85)
    ax.set_ylim(0, heights.max() * 1.4)  # room for the legend above the peak
    ax.set_xscale("log")
    ax.set_xlabel("tokens per row (log scale, special tokens included)")
    ax.set_ylabel("rows per bin (bins equal on the log axis)")
    ax.set_title("Token lengths before truncation")
    for q, style in (("p50", ":"), ("p90", "--"), ("p99", "-.")):
        ax.axvline(dist[q], color="#444444", linestyle=style, linewidth=1.2, label=f"{q} = {dist[q]:,.0f}")
    if result.max_length is not None:
        label = f"max_length = {result.max_length:,}: {dist['truncated_share']:.1%} truncated"
        ax.axvline(result.max_length, color=LIMIT_COLOR, linewidth=2.2, label=label)
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)


def _efficiency(ax, result: Findings) -> None:
    strategies = list(result.strategies)
    names = [s.name for s in strategies]
    values = [100 * s.efficiency for s in strategies]
    least = min(s.attention for s in strategies)
    best = max(values)
    colors = [BEST_COLOR if v == best else BAR_COLOR for v in values]
    ypos = np.arange(len(names))[::-1]
    bars = ax.barh(ypos, values, color=colors, height=0.62)
    ax.set_yticks(ypos, names, fontsize=10)
    ax.set_xlim(0, 118)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("padding efficiency: real tokens / token slots (%)")
    ax.set_title("Padding efficiency by strategy (higher is better)")
    for bar, strategy, value in zip(bars, strategies, values):
        y = bar.get_y() + bar.get_height() / 2
        ax.text(value - 1.5, y, f"{value:.1f}%", va="center", ha="right", color="white", fontsize=10, fontweight="bold")
        label = f"{result.steps_per_epoch(strategy):,} steps\n{strategy.attention / least:.2f}x attn"
        ax.text(value + 1.5, y, label, va="center", ha="left", fontsize=8.5, color="#333333")
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
