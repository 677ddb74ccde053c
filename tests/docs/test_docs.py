"""The docs site: it builds with ``mkdocs build --strict`` (no broken link, no missing
reference, no warning), its generated reference pages hold every ``lakecast`` command and
every setting, the tutorial's code is the new-user test's files and imports only public
names, and no text refers to issue numbers.

The strict build runs here, not as a separate ``make test`` step: the reference checks
need the built pages, so one build serves both (and ``pytest tests/docs`` checks it all).
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import dagster_lakecast
import lakecast
from lakecast.config import SETTINGS
from tests import ROOT

TUTORIAL_FILES = ("tests/newuser/project/fx.py", "tests/newuser/project/defs.yaml",
                  "tests/newuser/project/tables.py")
ISSUE = re.compile(r"\bissues? ?#?[0-9]+", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built with ``mkdocs build --strict`` into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    # the README's command, as a fresh clone runs it: no project folder on PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["make", "-s", "docs", f"SITE_DIR={out}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-5000:]
    return out


def page_text(site: Path, page: str) -> str:
    """The text of a built page: tags dropped, entities decoded, whitespace collapsed."""
    raw = (site / page / "index.html").read_text()
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", raw)))


def commands(parser: argparse.ArgumentParser,
             path: tuple[str, ...] = ("lakecast",)) -> Iterator[str]:
    """Every command and subcommand, and every choice of a positional argument of a
    leaf command (``lakecast server start``)."""
    yield " ".join(path)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))
        elif not action.option_strings and action.choices:
            for choice in action.choices:
                yield " ".join((*path, str(choice)))


def test_every_command_is_in_the_cli_reference(site: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from lakecast.tools.cli import build_parser

    monkeypatch.chdir(ROOT)  # this repository's project commands (produce, flag) too
    found = list(commands(build_parser()))
    assert {"lakecast server start", "lakecast snapshots restore", "lakecast replay",
            "lakecast produce", "lakecast flag set"} <= set(found), found
    text = page_text(site, "reference/cli")
    missing = [c for c in found if c not in text]
    assert not missing, missing


def test_every_setting_is_in_the_configuration_reference(site: Path) -> None:
    text = page_text(site, "reference/configuration")
    missing = [s.name for s in SETTINGS if s.name not in text]
    assert not missing, missing


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    import lakecast.api

    api = (site / "reference" / "api" / "index.html").read_text()
    dagster = (site / "reference" / "dagster" / "index.html").read_text()
    names = set(lakecast.__all__) | set(lakecast.api.__all__)
    missing = [n for n in sorted(names)  # enrich: lakecast.api.enrich.enrich (module name)
               if not re.search(rf'id="lakecast(\.api)?(\.enrich)?\.{n}"', api)]
    assert not missing, missing
    missing = [n for n in dagster_lakecast.__all__ if f'id="dagster_lakecast.{n}"' not in dagster]
    assert not missing, missing
    assert 'id="lakecast.api.__all__"' not in api
    assert 'id="dagster_lakecast.__all__"' not in dagster


def test_the_tutorial_imports_only_public_names() -> None:
    tree = ast.parse((ROOT / TUTORIAL_FILES[0]).read_text())
    public = {"lakecast": set(lakecast.__all__),
              "dagster_lakecast": set(dagster_lakecast.__all__)}
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in public:
                assert node.module == top, f"{node.module}: import from {top} itself"
                imported += [(top, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            assert not [a.name for a in node.names if a.name.split(".")[0] in public]
    assert imported, "the tutorial imports nothing from lakecast"
    assert not [(m, n) for m, n in imported if n not in public[m]], imported
    component = (ROOT / TUTORIAL_FILES[1]).read_text().split("type:", 1)[1].split()[0]
    assert component.rsplit(".", 1)[-1] in dagster_lakecast.__all__


def test_the_tutorial_includes_the_new_user_files(site: Path) -> None:
    source = (ROOT / "docs" / "tutorial.md").read_text()
    for name in TUTORIAL_FILES:
        assert f'--8<-- "{name}"' in source, name
    text = page_text(site, "tutorial")
    for name in TUTORIAL_FILES:
        for line in (ROOT / name).read_text().splitlines():
            assert re.sub(r"\s+", " ", line).strip() in text, (name, line)


def test_readme_is_short_and_nothing_names_an_issue(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    texts = {"README.md": readme}
    texts.update({str(p.relative_to(ROOT)): p.read_text()
                  for p in (ROOT / "docs").rglob("*.md")})
    texts.update({str(p.relative_to(site)): page_text(site, str(p.parent.relative_to(site)))
                  for p in site.rglob("index.html")})
    named = {name: ISSUE.findall(text) for name, text in texts.items() if ISSUE.search(text)}
    assert not named, named


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cluster_results(**changes: object) -> dict:
    """A ``cluster`` results file as :meth:`benchmarks.registry.Benchmark.report` writes
    it (a failed run)."""
    data = {
        "ratio": 1.62, "cluster": {"median_seconds": 3.24}, "local": {"median_seconds": 2.0},
        "verdicts": [{
            "measure": "cluster_over_local", "value": 1.62, "op": "<=", "target": 1.5,
            "unit": "x", "verdict": "FAIL", "compared_with": "the same batches on local[2]",
            "sides": {"cluster_s": 3.24, "local_s": 2.0},
            "rule": {"repeats": 5, "statistic": "median", "order": "fixed",
                     "first_run_counts": True, "note": ""}}],
        "off_target_conditions": None, "passed": False,
        "run": {"benchmark": "cluster", "command": "python -m benchmarks.cluster --batches 5",
                "cores": 24, "load_average_before_start": [0.25, 0.5, 0.75],
                "git_commit": "0123456789abcdef0123456789abcdef01234567",
                "date": "2030-01-02T03:04:05.678+00:00", "wall_seconds": 312.4}}
    data.update(changes)
    return data


def section(page: str, name: str) -> str:
    return page.split(f"## `{name}`\n")[1].split("\n## ")[0]


def test_the_benchmarks_page_shows_targets_and_each_results_file(tmp_path: Path) -> None:
    from benchmarks.targets import ALL

    hooks = load_hooks()
    (tmp_path / "cluster.json").write_text(json.dumps(_cluster_results()))
    passed = _cluster_results(passed=True)
    passed["verdicts"] = [{**passed["verdicts"][0], "value": 1.2, "verdict": "PASS"}]
    passed["run"] = {**passed["run"], "benchmark": "snapshots", "git_commit": "fedcba9876+dirty"}
    (tmp_path / "snapshots.json").write_text(json.dumps(passed))
    (tmp_path / "scratch_run.json").write_text(json.dumps({"run": {"git_commit": "5cra7c4"}}))
    page = hooks.benchmarks_markdown(tmp_path)

    # every declared benchmark: its command and each measure's target, run or not
    for bench in ALL:
        text = section(page, bench.name)
        assert f"python -m benchmarks.{bench.name}" in text, bench.name
        for m in bench.measures:
            assert f"| `{m.name}` | {hooks.target_text(m.op, m.target, m.unit)} |" in text
    cluster = section(page, "cluster")
    assert "| `cluster_over_local` | ≤ 1.5\u00d7 | the same batches on local\\[2\\] |" in cluster
    assert "median of 5 samples" in cluster
    # the run: date, machine, commit, command; value, target, verdict and sides
    assert "Date: 2030-01-02 03:04:05 UTC" in cluster
    assert "Machine: 24 cores, load average before start 0.25 / 0.50 / 0.75" in cluster
    assert "Commit: `0123456789abcdef0123456789abcdef01234567`" in cluster
    assert "Command: `python -m benchmarks.cluster --batches 5`" in cluster
    assert ("| `cluster_over_local` | 1.62\u00d7 | ≤ 1.5\u00d7 | **FAIL** | "
            "`cluster_s` 3.24, `local_s` 2 |") in cluster
    assert "Verdict of the run: FAIL" in cluster
    assert "not measured yet" not in cluster
    # FAIL as plainly as PASS; a dirty checkout said so
    snapshots = section(page, "snapshots")
    assert "| 1.2\u00d7 | ≤ 1.5\u00d7 | **PASS** |" in snapshots
    assert "`fedcba9876` with uncommitted changes" in snapshots
    # a measure declared since the run: NOT RUN, not an error
    assert "| `restore_over_cold_read` | \u2013 | ≤ 2\u00d7 | **NOT RUN** |" in snapshots
    summary = page.split("\n## ")[0]
    assert "| [`cluster`](#cluster) | 2030-01-02 03:04:05 UTC | `0123456789ab` | 1 FAIL |" \
        in summary
    # no results file: "not measured yet"; a scratch run (another --name) is not shown
    unmeasured = [b.name for b in ALL if b.name not in ("cluster", "snapshots")]
    for name in unmeasured:
        assert f"not measured yet (no `benchmarks/results/{name}.json`)" in section(page, name)
    assert "5cra7c4" not in page and "scratch_run" not in page
    assert not ISSUE.search(page)


def test_the_benchmarks_page_shows_the_official_figures_beside_the_latest_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import registry, targets
    from benchmarks.official import official
    from benchmarks.registry import Benchmark, Measure, Start, key

    hooks = load_hooks()
    bench = Benchmark("cluster", "python -m benchmarks.cluster", (
        Measure("cluster_over_local", 1.5, "<=", "x", "local[2]", value=key("r"),
                findings=("the shuffle waits for the slower worker.",)),
        Measure("cluster_over_local_max", 2.0, "<=", "x", "local[2]", value=key("m"),
                findings=("never shown: this figure passes.",))))
    quiet = Start((0.1, 0.1, 0.1), 0.0, "2030-01-02T03:04:05+00:00", None, 0.01)
    monkeypatch.setattr(registry, "git_commit", lambda root=None: "ab" * 20)
    monkeypatch.setattr(targets, "ALL", tuple(bench if b.name == "cluster" else b
                                              for b in targets.ALL))
    for r in (1.62, 1.55, 1.44):
        bench.report({"r": r, "m": 1.0}, quiet, results_dir=tmp_path)
    (tmp_path / "cluster.official.json").write_text(
        json.dumps(official(bench, results_dir=tmp_path)))
    text = section(hooks.benchmarks_markdown(tmp_path), "cluster")
    assert "**Official figures**" in text and f"`{'ab' * 20}`" in text
    assert "| `cluster_over_local` | 1.55\u00d7 | 1.62, 1.55, 1.44 | 1.44-1.62 | " \
        "≤ 1.5\u00d7 | **FAIL** |" in text
    # a failing official figure says why, from its findings; a passing one does not
    assert "- `cluster_over_local`: the shuffle waits for the slower worker." in text
    assert "never shown" not in text
    # the latest run is shown too, failing or not
    assert "**Latest results**" in text
    # a later series that measured one measure only: that one moves to its commit, the
    # other keeps its figure and names its own commit
    monkeypatch.setattr(registry, "git_commit", lambda root=None: "cd" * 20)
    for m in (1.1, 1.3, 1.2):
        bench.report({"m": m}, quiet, results_dir=tmp_path)
    (tmp_path / "cluster.official.json").write_text(
        json.dumps(official(bench, results_dir=tmp_path)))
    text = section(hooks.benchmarks_markdown(tmp_path), "cluster")
    assert f"counted runs at `{'cd' * 20}`, or at the commit a row names" in text
    assert f"| 1.62, 1.55, 1.44 (at `{'ab' * 6}`) | 1.44-1.62 |" in text
    assert "| `cluster_over_local_max` | 1.2\u00d7 | 1.1, 1.3, 1.2 | 1.1-1.3 |" in text
    # each ratio's history as a chart drawn from the history at build (inline SVG: no
    # network when the page is built or viewed)
    chart = text[text.index('<figure class="lakecast-chart"'):text.index("</figure>")]
    assert "<svg" in chart and "</svg>" in chart
    assert "cluster: each ratio by run" in chart and "target &lt;= 1.5x" in chart
    assert not re.search(r"""(?:href=["']|url\(|@import)\s*(?:https?:)?//""", chart)


def test_the_benchmarks_page_charts_each_latency_distribution(tmp_path: Path) -> None:
    hooks = load_hooks()
    data = {"sensor": {"latencies_s": [2.0, 1.0, 3.0]}, "rates": {
        "4000": {"latencies_s": [0.5, 0.7]}}, "continuous": {"latencies_s": [0.4]}}
    (tmp_path / "freshness.json").write_text(json.dumps(data))
    text = section(hooks.benchmarks_markdown(tmp_path), "freshness")
    chart = text[text.index('<figure class="lakecast-chart"'):text.index("</figure>")]
    assert "sensor (n=3, p50 2.00 s)" in chart and "rates.4000 (n=2, p50 0.60 s)" in chart
    assert "continuous" not in chart  # one value is no distribution


def test_the_benchmarks_page_shows_why_a_target_changed_and_runs_off_conditions(
        tmp_path: Path) -> None:
    from benchmarks.registry import Benchmark, Measure
    from benchmarks.targets import CLUSTER

    hooks = load_hooks()
    moved = Benchmark("cluster", CLUSTER.command, (
        Measure("cluster_over_local", 1.4, "<=", "x", "the same batches on local[2]",
                history=("2030-02-01: from 1.5 to 1.4, executors now start before the timing.",)),
    ), history=("2030-01-15: batches of 50,000 events instead of 20,000.",))
    text = "\n".join(hooks.targets_lines(moved))
    assert "**Why the targets changed:**" in text
    assert "- 2030-01-15: batches of 50,000 events instead of 20,000." in text
    assert "- `cluster_over_local`: 2030-02-01: from 1.5 to 1.4, executors now" in text
    assert "Why the targets changed" not in "\n".join(hooks.targets_lines(CLUSTER))
    # the target the run was judged against, and the one declared now
    data = _cluster_results(off_target_conditions="--events 5000 (the target is set at 50k)")
    rows = "\n".join(hooks.results_lines(moved, "cluster", data))
    assert "| 1.62\u00d7 | ≤ 1.5\u00d7 (now ≤ 1.4\u00d7) | **FAIL** |" in rows
    assert ("Verdict of the run: does not count (not at the targets' conditions: "
            "--events 5000 (the target is set at 50k))") in rows


def test_a_results_file_of_each_benchmark_is_committed_and_a_scratch_run_is_not() -> None:
    from benchmarks.targets import ALL

    hooks = load_hooks()
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = {b.name for b in ALL} | {p.stem for p in (ROOT / "benchmarks").glob("*.py")
                                     if p.stem not in hooks.NOT_BENCHMARKS}

    def ignored(name: str) -> bool:
        path = f"benchmarks/results/{name}.json"
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert not [n for n in sorted(names) if ignored(n)]
    assert ignored("bench_a_base") and ignored("scratch")


#: a measured figure stated in prose (the benchmarks page shows them from the results)
_NUM = r"\d+(?:[.,]\d+)?"
_UNIT = r"(?:ms|s|sec|seconds?|x|\u00d7)(?!\w)"
MEASURED = re.compile("|".join([
    rf"~\s?{_NUM}\s?{_UNIT}",  # ~22 ms, ~1.4 s
    rf"{_NUM}\s?{_UNIT}\s*\(?(?:p50|p90|p99|median|mean|max)\b",  # 1.9 s (p50)
    rf"\b(?:p50|p90|p99|median|mean|average)(?: of| was| is| at|:|=)?\s*~?{_NUM}\s?{_UNIT}",
    r"\d+\.\d+\s?(?:x|\u00d7)(?!\w)",  # 1.33x, 0.26x (or the times sign)
    r"\bratios? (?:of |was |is |= ?|: ?)?~?\d+\.\d+",  # ratio 0.26
    rf"{_NUM}\s?(?:x|\u00d7|times) (?:faster|slower|quicker)",  # 3.6x faster
]), re.IGNORECASE)
#: what a target (a declaration, not a measurement) reads like just before its figure
TARGET_WORDS = re.compile(r"<=|>=|[<>≤≥]|\btarget|\bat (?:most|least)\b|\bunder\b|\bbelow\b|"
                          r"\bwithin\b|\bevery\b|\bbudget\b|\bdefault\b", re.IGNORECASE)


def measured_figures(text: str) -> list[str]:
    """Measured figures stated in ``text``, targets aside."""
    found = []
    for m in MEASURED.finditer(text):
        if not TARGET_WORDS.search(text[max(0, m.start() - 30):m.start()]):
            found.append(text[max(0, m.start() - 40):m.end() + 10])
    return found


def test_the_measured_figure_check_finds_claims_not_targets() -> None:
    for claim in ("grows with the log (~22 ms at 20,200 files)", "sensor: 13.8 s (p50)",
                  "a p50 of 1.9 s", "median 12.8 s", "Lakecast is 1.33\u00d7 the join",
                  "the ratio 0.26 beats", "3.6x faster than the join"):
        assert measured_figures(claim), claim
    for target in ("the target is cluster / local[2] <= 1.5", "(target: ≤ 2 each)",
                   "(<= 20 ms on >= 20,000 commits)", "a run killed every ~5 min",
                   "succeeded within max_seconds + 60 s", "p50 / p99 / max of each",
                   "keep it under ~100 MB", "median of 4 samples", "target ≤ 0.33\u00d7"):
        assert not measured_figures(target), target


def test_no_measured_figure_is_typed_into_the_prose(site: Path) -> None:
    """Measured figures live in the results files, shown by the generated benchmarks
    page; the prose links there instead of quoting them (targets may be stated)."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    texts.update({str(p.relative_to(ROOT)): p.read_text()
                  for p in [*(ROOT / "docs").rglob("*.md"), *(ROOT / "deploy").glob("README*")]})
    hooks = load_hooks()
    texts.update({f"benchmarks/{p.name}": ast.get_docstring(ast.parse(p.read_text())) or ""
                  for p in (ROOT / "benchmarks").glob("*.py")
                  if p.stem not in hooks.NOT_BENCHMARKS})
    texts.update({str(p.relative_to(site)): page_text(site, str(p.parent.relative_to(site)))
                  for p in site.rglob("index.html")
                  if p.parent.relative_to(site).parts[:1] != ("benchmarks",)})
    found = {name: figures for name, text in texts.items() if (figures := measured_figures(text))}
    assert not found, found
