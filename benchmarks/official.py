"""Official figures: the median of at least three separate runs, with their spread.

    .venv/bin/python -m benchmarks.official broadcast_enrichment [--runs 3] [--commit C]

Reads ``benchmarks/results/<name>.history.jsonl`` (every run of the benchmark, appended by
:meth:`benchmarks.registry.Benchmark.report`) and, per pre-registered measure, takes the
last ``--runs`` runs at one commit that count (a clean checkout, the targets' conditions,
a quiet machine: :func:`benchmarks.registry.history_line`) and measured it. The official
value is their median, judged against the declared target; the spread is their minimum
and maximum. Written to ``<name>.official.json``; a measure with fewer counted runs is
reported as ``NOT OFFICIAL`` with the count. Default commit, per measure: the newest in
the history with enough counted runs of it (a run of some of a benchmark's modes leaves
the others' figures where they were), else the newest with any; each measure's row names
its commit. ``--commit``: that one for every measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.registry import RESULTS, Benchmark

MIN_RUNS = 3


def history(name: str, results_dir: Path = RESULTS) -> list[dict[str, Any]]:
    """Every run of ``name`` in its history, oldest first."""
    path = results_dir / f"{name}.history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def official(bench: Benchmark, runs: int = MIN_RUNS, commit: str | None = None,
             results_dir: Path = RESULTS) -> dict[str, Any]:
    """The official figures of ``bench`` at ``commit`` (see the module doc)."""
    if runs < MIN_RUNS:
        raise ValueError(f"an official figure needs at least {MIN_RUNS} runs, not {runs}")
    counted = [h for h in history(bench.name, results_dir) if h.get("counts")]
    measures = []
    for m in bench.measures:
        measured = [h for h in counted if h["values"].get(m.name) is not None]
        at = commit or _commit_of(measured, runs)
        samples = [h for h in measured if h["git_commit"] == at][-runs:]
        values = [float(h["values"][m.name]) for h in samples]
        row: dict[str, Any] = {"measure": m.name, "target": m.target, "op": m.op,
                               "unit": m.unit, "compared_with": m.compared_with,
                               "git_commit": at, "runs": values,
                               "dates": [h["date"] for h in samples]}
        if len(values) < runs:
            row.update(value=None, verdict="NOT OFFICIAL",
                       why=f"{len(values)} counted run(s) at {at}; {runs} needed")
        else:
            value = statistics.median(values)
            row.update(value=round(value, 4), verdict=m.verdict(value),
                       spread=[min(values), max(values)])
        measures.append(row)
    if commit is None:  # the newest commit any measure's figure is at
        order = [h["git_commit"] for h in counted]
        commits = [r["git_commit"] for r in measures if r["git_commit"] is not None]
        commit = max(commits, key=lambda c: len(order) - order[::-1].index(c), default=None)
    return {"benchmark": bench.name, "git_commit": commit, "runs_needed": runs,
            "measures": measures}


def _commit_of(measured: list[dict[str, Any]], runs: int) -> str | None:
    """The newest commit with ``runs`` counted runs in ``measured`` (oldest first), else
    the newest with any (``None``: no run)."""
    seen: dict[str, int] = {}
    for h in measured:
        seen[h["git_commit"]] = seen.get(h["git_commit"], 0) + 1
    for h in reversed(measured):
        if seen[h["git_commit"]] >= runs:
            return h["git_commit"]
    return measured[-1]["git_commit"] if measured else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.targets import ALL

    by_name = {b.name: b for b in ALL}
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("name", choices=sorted(by_name))
    ap.add_argument("--runs", type=int, default=MIN_RUNS)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    out = official(by_name[args.name], args.runs, args.commit)
    path = RESULTS / f"{args.name}.official.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{args.name}: official figures (median of {args.runs} counted runs at one commit)")
    for r in out["measures"]:
        if r["value"] is None:
            print(f"  {r['verdict']:12s} {r['measure']}: {r['why']}")
        else:
            lo, hi = r["spread"]
            print(f"  {r['verdict']:12s} {r['measure']}: {r['value']:.3f} {r['unit']} "
                  f"(runs {', '.join(f'{v:.3f}' for v in r['runs'])}; spread {lo:.3f}-{hi:.3f}; "
                  f"target {r['op']} {r['target']}; at {str(r['git_commit'])[:12]})")
    print(f"-> {path}")
    return out


if __name__ == "__main__":
    main()
