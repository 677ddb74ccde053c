"""Charts of the benchmarks' results, drawn when the docs are built (``docs/hooks.py``).

matplotlib (its Agg backend, no display, no network) draws each chart as an SVG string
that the benchmarks page embeds inline, text kept as text: nothing is fetched when the
page is built or viewed, and nothing is written beside the results.

* :func:`latency_svg` — every latency distribution of a results file (each object with a
  ``latencies_s`` list: the freshness benchmarks' paths and rates) as its empirical
  distribution, seconds on a log axis, its p50 marked.
* :func:`history_svg` — each ratio of a benchmark (a measure in ``x``) over its runs in
  ``<name>.history.jsonl``: a panel per measure, the declared target dashed, counted runs
  filled and the others hollow.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Iterator, Sequence
from typing import Any

#: the chart's size in inches (at 96 dpi in the page)
WIDTH, PANEL_HEIGHT = 7.5, 2.2


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    plt = _pyplot()
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight",
                metadata={"Date": None})  # the same results draw the same chart
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]  # the element alone: no XML prolog in the page


def latencies(result: Any, path: str = "") -> Iterator[tuple[str, list[float]]]:
    """``(dotted path, seconds)`` of every ``latencies_s`` list of two or more values in
    ``result``, in the file's order."""
    if isinstance(result, dict):
        xs = result.get("latencies_s")
        if isinstance(xs, list) and len(xs) >= 2 and all(
                isinstance(x, int | float) for x in xs):
            yield path or "latencies_s", [float(x) for x in xs]
        for k, v in result.items():
            if isinstance(v, dict):
                yield from latencies(v, f"{path}.{k}" if path else str(k))


def latency_svg(result: dict[str, Any], title: str) -> str | None:
    """The latency distributions of ``result`` in one chart (``None``: it has none)."""
    found = list(latencies(result))
    if not found:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
    for label, xs in found:
        ordered = sorted(x for x in xs if x > 0) or [min(xs)]
        share = [(i + 1) / len(ordered) for i in range(len(ordered))]
        (line,) = ax.step(ordered, share, where="post",
                          label=f"{label} (n={len(xs)}, p50 {statistics.median(xs):.2f} s)")
        ax.plot([statistics.median(xs)], [0.5], "o", color=line.get_color(), ms=4)
    if all(min(xs) > 0 for _, xs in found):
        ax.set_xscale("log")
    ax.set_xlabel("seconds from the events commit to the output commit holding its rows")
    ax.set_ylabel("share of commits")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, loc="left")
    ax.legend(fontsize=7, loc="lower right", frameon=False)
    return _svg(fig)


def history_svg(measures: Sequence[Any], runs: Sequence[dict[str, Any]],
                title: str) -> str | None:
    """Each ratio measure of ``measures`` (:class:`benchmarks.registry.Measure`, unit
    ``x``) over ``runs`` (history lines, oldest first), a panel each (``None``: no
    ratio has a value in any run)."""
    shown = [m for m in measures if m.unit == "x"
             and any(r.get("values", {}).get(m.name) is not None for r in runs)]
    if not shown:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(shown), 1, figsize=(WIDTH, PANEL_HEIGHT * len(shown)),
                             sharex=True, squeeze=False)
    labels = [f"{str(r.get('date', ''))[:10]}\n{str(r.get('git_commit', ''))[:7]}"
              for r in runs]
    for ax, m in zip(axes[:, 0], shown, strict=True):
        points = [(i, float(v), bool(r.get("counts"))) for i, r in enumerate(runs)
                  if (v := r.get("values", {}).get(m.name)) is not None]
        xs = [p[0] for p in points]
        ax.plot(xs, [p[1] for p in points], "-", color="0.6", lw=1)
        for filled in (True, False):
            sel = [p for p in points if p[2] is filled]
            if not sel:
                continue
            ax.plot([p[0] for p in sel], [p[1] for p in sel], "o", ms=5, color="C0",
                    mfc="C0" if filled else "white",
                    label="counted run" if filled else "run that does not count")
        ax.axhline(m.target, ls="--", color="C3", lw=1,
                   label=f"target {m.op} {m.target:g}{m.unit}")
        ax.set_ylabel(f"{m.name}\n({m.unit})", fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best", frameon=False)
    axes[-1, 0].set_xticks(range(len(runs)), labels, fontsize=6)
    axes[0, 0].set_title(title, loc="left")
    return _svg(fig)
