"""This repository's ``jobs/`` is the first project built on Lakecast: it uses only what a
user could use (``dagster_lakecast.__all__``), the library never imports it, and the
engine never imports Dagster."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dagster_lakecast
from tests import ROOT

PROJECT = ("jobs", "assets", "deploy", "examples", "benchmarks", "tests")


def imports(folder: Path) -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, module, names) of every import statement under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.lineno, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found += [(path, node.lineno, a.name, []) for a in node.names]
    return found


def test_jobs_import_only_the_public_names_of_dagster_lakecast():
    public = set(dagster_lakecast.__all__)
    bad = [f"{p.relative_to(ROOT)}:{line}: {module} {names}"
           for p, line, module, names in imports(ROOT / "jobs")
           if module.split(".")[0] == "dagster_lakecast"
           and (module != "dagster_lakecast" or not set(names) <= public)]
    assert not bad, "jobs/ reaches past dagster_lakecast.__all__:\n" + "\n".join(bad)
    used = {n for _, _, module, names in imports(ROOT / "jobs")
            if module == "dagster_lakecast" for n in names}
    assert {"declare_pipeline", "PipelineDeclaration", "LakecastSparkResource"} <= used


def test_the_packages_never_import_the_project():
    bad = [f"{p.relative_to(ROOT)}:{line}: {module}"
           for p, line, module, _ in imports(ROOT / "platform")
           if module.split(".")[0] in PROJECT]
    assert not bad, bad


def test_the_engine_imports_no_dagster():
    static = [f"{p.relative_to(ROOT)}:{line}: {module}"
              for p, line, module, _ in imports(ROOT / "platform" / "lakecast")
              if module.split(".")[0].startswith("dagster")]
    assert not static, static
    # and at run time: the engine's modules, the CLI included, load no dagster module
    code = ("import sys, pkgutil, importlib, lakecast\n"
            "for m in pkgutil.walk_packages(lakecast.__path__, 'lakecast.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.startswith('dagster')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_pipeline_of_the_project_has_a_continuous_job():
    from jobs.definitions import PIPELINES, defs

    names = {j.name for j in defs.resolve_all_job_defs()}
    for made in PIPELINES:
        assert made.continuous.name == f"{made.declaration.name}_continuous"
        assert made.continuous.name in names
        assert made.continuous.name in made.handle.writers
    assert {"enrichment_continuous", "fraud_continuous", "scoring_continuous"} <= names
