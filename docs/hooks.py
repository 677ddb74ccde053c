"""MkDocs hooks: the generated parts of the docs site, never maintained by hand.

A page holds a marker line; :func:`on_page_markdown` replaces it with Markdown made from
the code and the results at build time:

- ``<!-- generated:cli -->``: every ``lakecast`` command and subcommand with its
  ``--help``, from :func:`lakecast.tools.cli.build_parser`;
- ``<!-- generated:settings -->``: every environment variable, from
  :data:`lakecast.config.SETTINGS`;
- ``<!-- generated:benchmarks -->``: every benchmark module of ``benchmarks/`` (its
  command, what it compares, its targets) with the newest results in
  ``benchmarks/results/<name>.json``, or "not run yet".
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
# the packages and the example project of THIS checkout, before any installed copy
for _p in (str(ROOT), str(ROOT / "platform"), str(ROOT / "docs")):
    if _p not in sys.path[:3]:
        sys.path.insert(0, _p)

from griffe_roles import plain_roles  # noqa: E402

HELP_WIDTH = "88"
#: benchmark modules that are parts of others, not benchmarks
NOT_BENCHMARKS = {"__init__", "common", "soak_parts"}
_ISSUE = re.compile(r"\s*\(issues? [0-9]+(?:'s)?\s*([^)]*)\)|,?\s*\bissues? [0-9]+(?:'s)?")


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


def without_issues(text: str) -> str:
    """``text`` without references to issue numbers."""
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


def _benchmark_modules() -> list[tuple[str, ast.Module, str]]:
    out = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem not in NOT_BENCHMARKS:
            source = path.read_text()
            out.append((path.stem, ast.parse(source), source))
    return out


def _targets(tree: ast.Module, source: str) -> list[str]:
    found = []
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and target.id.startswith("TARGET"):
            found.append(ast.get_source_segment(source, node) or target.id)
    return found


def _result_lines(data: Any) -> list[str]:
    date = _find(data, ("date", "timestamp", "measured_at", "finished_at", "started_at",
                        "when", "time"))
    machine = _find(data, ("machine", "host", "hostname", "platform", "cpu"))
    commit = _find(data, ("commit", "git_commit", "git_sha", "sha", "revision"))
    if isinstance(machine, dict):
        machine = ", ".join(f"{k} {v}" for k, v in machine.items())
    lines = [f"Latest results: date {md_text(str(date or 'not recorded'))}, machine "
             f"{md_text(str(machine or 'not recorded'))}, commit "
             f"{md_text(str(commit or 'not recorded'))}.", ""]
    if isinstance(data, dict) and data.get("targets") is not None:
        lines += ["Targets recorded with the results:", "", "```json",
                  json.dumps(data["targets"], indent=2, default=str), "```", ""]
    shown = json.dumps(data, indent=2, default=str).splitlines()
    if len(shown) > 120:
        shown = [*shown[:120], f"... ({len(shown) - 120} more lines in the file)"]
    lines += ['??? note "The results file"', "", "    ```json",
              *(f"    {line}" for line in shown), "    ```", ""]
    return lines


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


def benchmarks_markdown() -> str:
    """Per benchmark: command, what it compares, targets, latest results."""
    results = ROOT / "benchmarks" / "results"
    lines: list[str] = []
    names = set()
    for name, tree, source in _benchmark_modules():
        names.add(name)
        doc = without_issues(plain_roles(ast.get_docstring(tree) or "")).strip()
        doc = re.sub(r"``(.+?)``", r"`\1`", doc)
        title, _, body = doc.partition("\n")
        usage, body = split_usage(name, body)
        lines += [f"## `{name}`", "", title.strip(), "", "```bash", usage, "```", "",
                  body, ""]
        targets = _targets(tree, source)
        if targets:
            lines += ["Targets in the code:", "", "```python", *targets, "```", ""]
        path = results / f"{name}.json"
        if path.is_file():
            lines += _result_lines(json.loads(path.read_text()))
        else:
            lines += [f"Results: not run yet (no `benchmarks/results/{name}.json`).", ""]
    others = sorted(p for p in results.glob("*.json") if p.stem not in names)
    if others:
        lines += ["## Other results", ""]
        for path in others:
            lines += [f"### `{path.stem}`", "", *_result_lines(json.loads(path.read_text()))]
    return "\n".join(lines)


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
            markdown = markdown.replace(marker, generate())
    return markdown
