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
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import dagster_lakecast
import lakecast
from lakecast.config import SETTINGS
from tests import ROOT

TUTORIAL_FILES = ("tests/newuser/project/fx.py", "tests/newuser/project/defs.yaml")
ISSUE = re.compile(r"\bissues? ?#?[0-9]+", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built with ``mkdocs build --strict`` into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
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


def test_the_benchmarks_page_shows_results_or_not_run_yet(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    hooks = load_hooks()
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks",
                    ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "cluster.json").write_text(json.dumps({
        "date": "2030-01-02T03:04:05Z", "machine": "test-box", "commit": "abc1234",
        "targets": {"ratio": "<= 1.5"}, "ratio": 1.1}))
    (results / "extra.json").write_text(json.dumps({"commit": "def5678"}))
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    page = hooks.benchmarks_markdown()
    modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                     if p.stem not in hooks.NOT_BENCHMARKS)
    for name in modules:
        assert f"## `{name}`" in page and f"python -m benchmarks.{name}" in page, name
    cluster = page.split("## `cluster`")[1].split("\n## ")[0]
    assert "2030-01-02T03:04:05Z" in cluster and "test-box" in cluster
    assert "abc1234" in cluster and "not run yet" not in cluster
    assert page.count("not run yet") == len(modules) - 1
    assert "### `extra`" in page and "def5678" in page
    assert not ISSUE.search(page)
