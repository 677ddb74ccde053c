"""Official figures: the median of at least three separate runs, with their spread.

    .venv/bin/python -m benchmarks.official broadcast_enrichment [--runs 3] [--commit C]

Reads ``benchmarks/results/<name>.history.jsonl`` (every run of the benchmark, appended by
:meth:`benchmarks.registry.Benchmark.report`) and, per pre-registered measure, takes the
last ``--runs`` runs at one commit that count (a clean checkout, the targets' conditions,
a quiet machine: :func:`benchmarks.registry.history_line`) and measured it. The official
value is their median, judged against the declared target; the spread is their minimum
and maximum. Written to ``<name>.official.json``; a measure with fewer counted runs is
reported as ``NOT OFFICIAL`` with the count. Default commit: the newest in the history
with counted runs.
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
    if commit is None:
        commit = counted[-1]["git_commit"] if counted else None
    at = [h for h in counted if h["git_commit"] == commit]
    measures = []
    for m in bench.measures:
        samples = [h for h in at if h["values"].get(m.name) is not None][-runs:]
        values = [float(h["values"][m.name]) for h in samples]
        row: dict[str, Any] = {"measure": m.name, "target": m.target, "op": m.op,
                               "unit": m.unit, "compared_with": m.compared_with,
                               "runs": values, "dates": [h["date"] for h in samples]}
        if len(values) < runs:
            row.update(value=None, verdict="NOT OFFICIAL",
                       why=f"{len(values)} counted run(s) at {commit}; {runs} needed")
        else:
            value = statistics.median(values)
            row.update(value=round(value, 4), verdict=m.verdict(value),
                       spread=[min(values), max(values)])
        measures.append(row)
    return {"benchmark": bench.name, "git_commit": commit, "runs_needed": runs,
            "measures": measures}


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
    print(f"{args.name}: official figures at {out['git_commit']} "
          f"(median of {args.runs} counted runs)")
    for r in out["measures"]:
        if r["value"] is None:
            print(f"  {r['verdict']:12s} {r['measure']}: {r['why']}")
        else:
            lo, hi = r["spread"]
            print(f"  {r['verdict']:12s} {r['measure']}: {r['value']:.3f} {r['unit']} "
                  f"(runs {', '.join(f'{v:.3f}' for v in r['runs'])}; spread {lo:.3f}-{hi:.3f}; "
                  f"target {r['op']} {r['target']})")
    print(f"-> {path}")
    return out


if __name__ == "__main__":
    main()
