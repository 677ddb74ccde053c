"""MkDocs hooks: the generated parts of the docs site, never maintained by hand.

A page holds a marker line; :func:`on_page_markdown` replaces it with Markdown made from
the code and the results at build time:

- ``<!-- generated:cli -->``: every ``lakecast`` command and subcommand with its
  ``--help``, from :func:`lakecast.tools.cli.build_parser`;
- ``<!-- generated:settings -->``: every environment variable, from
  :data:`lakecast.config.SETTINGS`;
- ``<!-- generated:benchmarks -->``: every benchmark of ``benchmarks/targets.py`` (and any
  other benchmark module): its command and what it compares (the module's docstring), its
  declared targets and why they changed, and the verdicts, date, machine and commit of its
  results file ``benchmarks/results/<name>.json``, or "not measured yet". The measured
  figures on the site are these, never typed by hand.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]


def use_checkout() -> None:
    """Put the packages and the example project of THIS checkout before any installed
    copy on ``sys.path`` (again at each page: plugins may reset the path after the hooks
    load, and ``mkdocs build`` from a fresh clone has no project folder on it)."""
    for p in (str(ROOT), str(ROOT / "platform"), str(ROOT / "docs")):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)


use_checkout()

from griffe_roles import plain_roles  # noqa: E402

HELP_WIDTH = "88"
#: benchmark modules that are parts of others, not benchmarks
NOT_BENCHMARKS = {"__init__", "charts", "common", "freshness_watch", "soak_parts", "registry",
                  "targets", "official", "keyed_phases", "continuous_phases", "spark_sides"}
_ITEM = r"(?:'s)?(?:,? items? [0-9]+(?:[-\u2013][0-9]+)?)?"
_ISSUE = re.compile(rf"\s*\(issues? [0-9]+{_ITEM}\s*([^)]*)\)|,?\s*\bissues? [0-9]+{_ITEM}")


# ---------------------------------------------------------------- the CLI


def walk_commands(parser: argparse.ArgumentParser,
                  path: tuple[str, ...] = ("lakecast",)) -> Iterator[tuple[str, ...]]:
    """Every command under ``parser`` as a word tuple, parents first: subcommands
    (``lakecast snapshots list``) and the choices of a positional action argument
    (``lakecast server start``)."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_commands(sub, (*path, name))
        elif not action.option_strings and action.choices and action.dest == "action":
            for choice in action.choices:
                yield (*path, str(choice))


def find_parser(parser: argparse.ArgumentParser,
                words: tuple[str, ...]) -> argparse.ArgumentParser | None:
    """The parser of the command ``words`` (without ``lakecast``), or None for an action
    choice (``server start``), which has no parser of its own."""
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            return None
        parser = subs[0].choices[word]
    return parser


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``lakecast`` parser without any project's commands, and with this repository's
    (``[tool.lakecast] pipelines`` in its ``pyproject.toml``)."""
    from lakecast.tools import cli, registry

    old_cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with mock.patch.object(registry, "add_project_commands", lambda sub: None):
            engine = cli.build_parser()
        full = cli.build_parser()
    finally:
        os.chdir(old_cwd)
    return engine, full


def _help(parser: argparse.ArgumentParser) -> str:
    with mock.patch.dict(os.environ, {"COLUMNS": HELP_WIDTH}):
        return parser.format_help().rstrip()


def _command_section(full: argparse.ArgumentParser, words: tuple[str, ...],
                     below: int = 0) -> list[str]:
    parser = find_parser(full, words[1:])
    if parser is None:
        return []
    depth = min(len(words) + below, 5)
    out = [f"{'#' * depth} `{' '.join(words)}`", ""]
    actions = [a for a in parser._actions
               if not a.option_strings and a.choices and a.dest == "action"
               and not isinstance(a, argparse._SubParsersAction)]
    for action in actions:
        listed = ", ".join(f"`{' '.join(words)} {c}`" for c in action.choices)
        out += [f"Actions: {listed}.", ""]
    out += ["```text", _help(parser), "```", ""]
    return out


def cli_markdown() -> str:
    """The CLI reference: the engine's commands, then this project's."""
    engine, full = build_parsers()
    ours = {w[1] for w in walk_commands(engine) if len(w) > 1}
    project = [w for w in walk_commands(full) if len(w) > 1 and w[1] not in ours]
    lines = ["```text", _help(engine), "```", ""]
    for words in walk_commands(engine):
        if len(words) > 1:
            lines += _command_section(full, words)
    if project:
        lines += ["## Commands of this repository's example project", "",
                  "A project adds commands through its pipelines module's `COMMANDS` "
                  "(see `LAKECAST_PIPELINES`); this repository's `jobs/registry.py` adds "
                  "these:", ""]
        for words in project:
            lines += _command_section(full, words, below=1)
    return "\n".join(lines)


# ---------------------------------------------------------------- settings


def md_text(text: str) -> str:
    """``text`` safe in a Markdown table cell: HTML and Markdown specials escaped outside
    its `code spans`."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([*_\[\]|\\])", r"\\\1", html.escape(parts[i], quote=False))
    return "`".join(parts)


def settings_markdown() -> str:
    """Every setting of :data:`lakecast.config.SETTINGS` as a table row."""
    from lakecast.config import SETTINGS

    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.name}` | {md_text(s.default)} | {md_text(s.description)} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- benchmarks

#: how a comparison reads in a table
_OPS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}
#: a cell with nothing to show (an en dash), and the multiplication sign
DASH, TIMES = "\u2013", "\u00d7"
#: a unit as written after a number
_UNITS = {"x": TIMES, "s": " s", "ms": " ms", "events/s": " events/s", "bool": ""}


def without_issues(text: str) -> str:
    """``text`` without references to issue numbers (nor their item numbers)."""
    def keep(m: re.Match[str]) -> str:
        rest = (m[1] or "").lstrip(":;, ")
        return f" ({rest})" if rest else ""

    return _ISSUE.sub(keep, text)


def _find(data: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(data, dict):
        return None
    for key in keys:
        if data.get(key) not in (None, ""):
            return data[key]
    for nested in ("meta", "metadata", "environment", "env", "run", "provenance"):
        found = _find(data.get(nested), keys)
        if found is not None:
            return found
    return None


def _benchmark_modules() -> dict[str, str]:
    """Every benchmark module of ``benchmarks/``: its name and docstring."""
    out = {}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem not in NOT_BENCHMARKS:
            out[path.stem] = ast.get_docstring(ast.parse(path.read_text())) or ""
    return out


def split_usage(name: str, doc: str) -> tuple[str, str]:
    """The usage lines of a benchmark's docstring (the command and its options) and the
    rest, with square brackets outside code escaped (Markdown would take them for links)."""
    usage: list[str] = []
    rest: list[str] = []
    for line in doc.splitlines():
        stripped = line.strip().strip("`")
        if (f"benchmarks.{name}" in line and not usage) or (
                usage and rest == [] and stripped.startswith("[")):
            usage.append(stripped.replace(".venv/bin/", ""))
        else:
            if usage or line.strip():
                rest.append(line)
    escaped = []
    for line in rest:
        if not line.startswith("    "):
            parts = line.split("`")
            parts[::2] = [re.sub(r"([\[\]])", r"\\\1", p) for p in parts[::2]]
            line = "`".join(parts)
        escaped.append(line)
    return "\n".join(usage) or f"python -m benchmarks.{name}", "\n".join(escaped).strip()


def number(value: Any) -> str:
    """A figure as the page shows it: at most 3 decimals, no trailing zeros."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return md_text(json.dumps(value, default=str))
    if isinstance(value, int):
        return f"{value:,}"
    text = f"{value:,.3f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def with_unit(value: float | None, unit: str) -> str:
    """A measure's value with its unit (a dash: not measured)."""
    if value is None:
        return DASH
    if unit == "bool":
        return "yes" if value else "no"
    return number(value) + _UNITS.get(unit, f" {unit}")


def target_text(op: str, target: float, unit: str) -> str:
    """``≤ 1.2`` and the unit; a ``bool`` measure's target (``>= 1``) reads ``holds``."""
    if unit == "bool":
        return "holds" if (op, target) in ((">=", 1.0), (">", 0.0)) else f"{op} {target}"
    return f"{_OPS.get(op, op)} {number(target)}{_UNITS.get(unit, f' {unit}')}"


def rule_text(rule: dict[str, Any]) -> str:
    """A :class:`benchmarks.registry.Rule` (as a dict) in words."""
    repeats, statistic = rule.get("repeats", 1), rule.get("statistic", "")
    words = ("one value" if statistic == "single" or (repeats == 1 and statistic == "total")
             else f"{statistic} of {repeats} sample{'s' if repeats != 1 else ''}")
    if rule.get("order", "fixed") != "fixed":
        words += f", sides' order {rule['order']}"
    if not rule.get("first_run_counts", True):
        words += ", warm-up run dropped"
    if rule.get("note"):
        words += f"; {without_issues(rule['note']).strip()}"
    return md_text(words)


def sides_text(sides: Any) -> str:
    """Side values as ``label value`` pairs (a dash: none)."""
    if not isinstance(sides, dict) or not sides:
        return DASH
    parts = []
    for label, value in sides.items():
        if isinstance(value, list) and all(isinstance(v, int | float) for v in value):
            shown = "[" + ", ".join(number(v) for v in value) + "]"
        else:
            shown = DASH if value is None else number(value)
        parts.append(f"`{label}` {shown}")
    return ", ".join(parts)


def date_text(date: Any) -> str:
    """An ISO date as ``2030-01-02 03:04:05 UTC`` (as written when it does not parse)."""
    try:
        when = datetime.fromisoformat(str(date).replace("Z", "+00:00"))
    except ValueError:
        return md_text(str(date))
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if when.tzinfo else "")


def commit_text(commit: Any, short: bool = False) -> str:
    """A commit (``+dirty``: the checkout had changes the commit does not hold)."""
    sha, _, dirty = str(commit).partition("+")
    return f"`{sha[:12] if short else sha}`" + (" with uncommitted changes" if dirty else "")


def targets_lines(bench: Any) -> list[str]:
    """The declared targets of a :class:`benchmarks.registry.Benchmark`, and why they
    changed (its and its measures' ``history``)."""
    lines = ["**Targets** (declared in `benchmarks/targets.py` before any run):", "",
             "| Measure | Target | Compared with | Rule |", "|---|---|---|---|"]
    for m in bench.measures:
        lines.append(f"| `{m.name}` | {target_text(m.op, m.target, m.unit)} | "
                     f"{md_text(without_issues(m.compared_with))} | "
                     f"{rule_text(asdict(m.rule))} |")
    history = [(None, s) for s in bench.history]
    history += [(m.name, s) for m in bench.measures for s in m.history]
    lines.append("")
    if history:
        lines += ["**Why the targets changed:**", ""]
        lines += [f"- {f'`{name}`: ' if name else ''}{md_text(without_issues(s))}"
                  for name, s in history]
        lines.append("")
    return lines


def run_lines(data: dict[str, Any]) -> list[str]:
    """When, where, at which commit and how a results file was measured."""
    run = data.get("run") if isinstance(data.get("run"), dict) else {}
    date = run.get("date") or _find(data, ("date", "timestamp", "measured_at", "started_at"))
    commit = run.get("git_commit") or _find(data, ("commit", "git_commit", "git_sha"))
    if run.get("cores") or run.get("load_average_before_start"):
        machine = f"{run.get('cores', '?')} cores"
        load = run.get("load_average_before_start")
        if isinstance(load, list) and load:
            shown = [f"{x:.2f}" if isinstance(x, int | float) else md_text(str(x))
                     for x in load]
            machine += f", load average before start {' / '.join(shown)} (1 / 5 / 15 min)"
        steal = run.get("cpu_steal_fraction")
        if isinstance(steal, int | float):
            machine += f", {steal:.1%} of the CPU time taken by the VM's host during the run"
    else:
        found = _find(data, ("machine", "host", "hostname", "platform", "cpu"))
        machine = md_text(str(found)) if found else "not recorded"
    lines = [f"- Date: {date_text(date) if date else 'not recorded'}",
             f"- Machine: {machine}",
             f"- Commit: {commit_text(commit) if commit else 'not recorded'}",
             f"- Command: `{run['command']}`" if run.get("command") else "- Command: not recorded"]
    if isinstance(run.get("wall_seconds"), int | float):
        lines.append(f"- Wall time: {number(run['wall_seconds'])} s")
    return lines


def run_verdict(data: dict[str, Any]) -> str:
    """The whole run's verdict: PASS (every measured measure passed), FAIL, NOT RUN
    (nothing measured), or why it does not count."""
    if data.get("off_target_conditions"):
        return ("does not count (not at the targets' conditions: "
                f"{md_text(str(data['off_target_conditions']))})")
    if data.get("passed"):
        return "PASS"
    rows = [r for r in data.get("verdicts") or [] if isinstance(r, dict)]
    return "FAIL" if any(r.get("verdict") != "NOT RUN" for r in rows) else "NOT RUN"


def verdict_rows(bench: Any, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The results file's verdict rows, then a NOT RUN row for each measure declared
    since."""
    rows = [r for r in data.get("verdicts") or [] if isinstance(r, dict)]
    seen = {r.get("measure") for r in rows}
    for m in bench.measures if bench else ():
        if m.name not in seen:
            rows.append({"measure": m.name, "value": None, "op": m.op, "target": m.target,
                         "unit": m.unit, "verdict": "NOT RUN",
                         "sides": {}, "missing": True})
    return rows


def results_lines(bench: Any, name: str, data: dict[str, Any]) -> list[str]:
    """A results file: its run, and a row per measure (value, target, verdict, sides)."""
    lines = [f"**Latest results** (`benchmarks/results/{name}.json`):", "", *run_lines(data)]
    declared = {m.name: m for m in bench.measures} if bench else {}
    if bench and data.get("verdicts") is not None:
        lines += [f"- Verdict of the run: {run_verdict(data)}", "",
                  "| Measure | Value | Target | Verdict | Side values |",
                  "|---|---|---|---|---|"]
        for r in verdict_rows(bench, data):
            unit = str(r.get("unit", ""))
            target = target_text(str(r.get("op")), r.get("target"), unit)
            now = declared.get(r.get("measure"))
            if now and (now.op, now.target) != (r.get("op"), r.get("target")):
                target += f" (now {target_text(now.op, now.target, now.unit)})"
            sides = ("not in this results file (declared after the run)"
                     if r.get("missing") else sides_text(r.get("sides")))
            lines.append(f"| `{r.get('measure')}` | {with_unit(r.get('value'), unit)} | "
                         f"{target} | **{r.get('verdict')}** | {sides} |")
    elif bench:
        lines += ["", "This results file has no verdicts (it was written before the "
                  "benchmark judged its runs against `benchmarks/targets.py`): run it again."]
    lines.append("")
    shown = json.dumps(data, indent=2, default=str).splitlines()
    if len(shown) > 120:
        shown = [*shown[:120], f"... ({len(shown) - 120} more lines in the file)"]
    lines += ['??? note "The results file"', "", "    ```json",
              *(f"    {line}" for line in shown), "    ```", ""]
    return lines


def official_lines(bench: Any, name: str, data: dict[str, Any]) -> list[str]:
    """A benchmark's official figures (``benchmarks/results/<name>.official.json``, made by
    ``python -m benchmarks.official``): per measure the median of its counted runs, the
    runs and their spread, the target and the verdict; under them, what each failing
    measure's findings say (:attr:`benchmarks.registry.Measure.findings`)."""
    lines = [f"**Official figures** (`benchmarks/results/{name}.official.json`: the median of "
             f"{data.get('runs_needed')} counted runs at "
             f"{commit_text(data.get('git_commit'))}, or at the commit a row names):", "",
             "| Measure | Official value | Runs | Spread | Target | Verdict |",
             "|---|---|---|---|---|---|"]
    for r in data.get("measures", []):
        unit = str(r.get("unit", ""))
        runs = ", ".join(number(v) for v in r.get("runs", [])) or DASH
        if r.get("git_commit") not in (None, data.get("git_commit")):
            runs += f" (at {commit_text(r['git_commit'], short=True)})"
        spread = r.get("spread")
        lines.append(
            f"| `{r.get('measure')}` | {with_unit(r.get('value'), unit)} | {runs} | "
            f"{f'{number(spread[0])}-{number(spread[1])}' if spread else DASH} | "
            f"{target_text(str(r.get('op')), r.get('target'), unit)} | "
            f"**{r.get('verdict')}** |")
    lines.append("")
    declared = {m.name: m for m in bench.measures} if bench else {}
    failing = [(m, s) for r in data.get("measures", []) if r.get("verdict") == "FAIL"
               and (m := declared.get(r.get("measure"))) for s in m.findings]
    if failing:
        lines += ["**Why the failing figures fail, and what would meet them:**", ""]
        lines += [f"- `{m.name}`: {md_text(without_issues(s))}" for m, s in failing]
        lines.append("")
    return lines


def chart_lines(svg: str | None, caption: str) -> list[str]:
    """An inline SVG chart (:mod:`benchmarks.charts`) as one raw HTML block, or nothing."""
    if svg is None:
        return []
    body = "\n".join(line for line in svg.splitlines() if line.strip())
    return [f'<figure class="lakecast-chart" markdown="0">{body}'
            f"<figcaption>{md_text(caption)}</figcaption></figure>", ""]


def history_lines(bench: Any, name: str, results: Path) -> list[str]:
    """The chart of each ratio's history (``<name>.history.jsonl``), or nothing."""
    from benchmarks.charts import history_svg
    from benchmarks.official import history

    runs = history(name, results)
    if bench is None or not runs:
        return []
    return chart_lines(history_svg(bench.measures, runs, f"{name}: each ratio by run"),
                       f"Every run in benchmarks/results/{name}.history.jsonl, oldest "
                       "first; filled: a run that counts towards the official figures.")


def _read_results(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def summary_lines(sections: list[tuple[str, Any, Any]]) -> list[str]:
    """One row per benchmark: its latest run's date, commit and verdicts (``data``:
    its results, ``None`` when not measured yet, an error text when unreadable)."""
    lines = ["| Benchmark | Latest run | Commit | Verdicts |", "|---|---|---|---|"]
    for name, bench, data in sections:
        link = f"[`{name}`](#{name})"
        if not isinstance(data, dict):
            state = "not measured yet" if data is None else "results file unreadable"
            lines.append(f"| {link} | {state} | {DASH} | {DASH} |")
            continue
        run = data.get("run") or {}
        date = run.get("date") or _find(data, ("date", "timestamp"))
        commit = run.get("git_commit") or _find(data, ("commit", "git_commit"))
        if bench and data.get("verdicts") is not None:
            counts = Counter(r["verdict"] for r in verdict_rows(bench, data))
            verdicts = ", ".join(f"{counts[v]} {v}" for v in ("PASS", "FAIL", "NOT RUN")
                                 if counts[v])
            if data.get("off_target_conditions"):
                verdicts += " (not at the targets' conditions: does not count)"
        else:
            verdicts = "no verdicts" if bench else "no pre-registered targets"
        when = date_text(date) if date else "not recorded"
        sha = commit_text(commit, short=True) if commit else "not recorded"
        lines.append(f"| {link} | {when} | {sha} | {verdicts} |")
    return [*lines, ""]


def benchmarks_markdown(results_dir: Path | None = None) -> str:
    """A summary table, then per benchmark (those of ``benchmarks/targets.py`` first, then
    any other benchmark module): its command and what it compares (the module's
    docstring), its declared targets, and its results file's run and verdicts, or "not
    measured yet"."""
    from benchmarks.targets import ALL

    results = results_dir or ROOT / "benchmarks" / "results"
    docs = _benchmark_modules()
    declared = {b.name: b for b in ALL}
    names = [*declared, *(n for n in docs if n not in declared)]
    sections: list[tuple[str, Any, Any]] = []
    body: list[str] = []
    for name in names:
        bench = declared.get(name)
        doc = without_issues(plain_roles(docs.get(name, ""))).strip()
        doc = re.sub(r"``(.+?)``", r"`\1`", doc)
        title, _, rest = doc.partition("\n")
        usage, rest = split_usage(name, rest)
        if bench and f"benchmarks.{name}" not in usage:
            usage = bench.command
        body += [f"## `{name}`", "", title.strip(), "", "```bash", usage, "```", "", rest, ""]
        body += (targets_lines(bench) if bench else
                 ["No pre-registered targets in `benchmarks/targets.py`.", ""])
        official = results / f"{name}.official.json"
        if official.is_file():
            figures, error = _read_results(official)
            if error is None and isinstance(figures, dict):
                body += official_lines(bench, name, figures)
        body += history_lines(bench, name, results)
        path = results / f"{name}.json"
        data: Any = None
        if path.is_file():
            data, error = _read_results(path)
            if error is None and isinstance(data, dict):
                from benchmarks.charts import latency_svg

                body += chart_lines(latency_svg(data, f"{name}: latency distributions"),
                                    f"Each latency distribution of benchmarks/results/"
                                    f"{name}.json; dot: its p50.")
                body += results_lines(bench, name, data)
            else:
                data = error or "not a JSON object"
                body += [f"Results: `benchmarks/results/{name}.json` could not be read "
                         f"({md_text(data)}).", ""]
        else:
            body += [f"Results: not measured yet (no `benchmarks/results/{name}.json`).", ""]
        sections.append((name, bench, data))
    return "\n".join([*summary_lines(sections), *body])


# ---------------------------------------------------------------- the hook

GENERATORS = {
    "<!-- generated:cli -->": cli_markdown,
    "<!-- generated:settings -->": settings_markdown,
    "<!-- generated:benchmarks -->": benchmarks_markdown,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each marker line with what it generates."""
    for marker, generate in GENERATORS.items():
        if marker in markdown:
            use_checkout()
            markdown = markdown.replace(marker, generate())
    return markdown
