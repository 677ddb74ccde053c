"""One place resolves every setting: each ``LAKECAST_*`` variable read in ``platform/``,
``jobs/`` or ``assets/`` is read by :mod:`lakecast.config`, documented there with its
default, and in the docs (``docs/``, ``README.md``, the configuration reference generated
from ``lakecast.config.SETTINGS``); no other module reads one from the environment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lakecast.config
from tests import ROOT as PROJECT_ROOT

NAME = re.compile(r"LAKECAST_[A-Z0-9_]+")
CONFIG = Path(lakecast.config.__file__).resolve()
FOLDERS = ("platform", "jobs", "assets")


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (PROJECT_ROOT / folder).rglob("*.py") if p.resolve() != CONFIG)


def _names(tree: ast.AST) -> set[str]:
    """``LAKECAST_*`` names given as whole string constants (what code reads)."""
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and NAME.fullmatch(n.value)}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _env_reads(tree: ast.AST) -> set[str]:
    """``LAKECAST_*`` names read with ``os.environ.get``/``[...]``/``os.getenv``, given as
    a constant or a module constant bound to one."""
    bound = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
             and NAME.fullmatch(n.value.value) for t in n.targets if isinstance(t, ast.Name)}

    def name(arg: ast.AST) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value if NAME.fullmatch(arg.value) else None
        return bound.get(arg.id) if isinstance(arg, ast.Name) else None

    found: set[str | None] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.args and isinstance(n.func, ast.Attribute) and (
                (n.func.attr == "get" and _is_environ(n.func.value))
                or (n.func.attr == "getenv" and isinstance(n.func.value, ast.Name)
                    and n.func.value.id == "os")):
            found.add(name(n.args[0]))
        elif isinstance(n, ast.Subscript) and _is_environ(n.value) and isinstance(
                n.ctx, ast.Load):
            found.add(name(n.slice))
    return {f for f in found if f}


def _docs() -> str:
    """The docs' text: README, docs/ pages, and the configuration reference, which the docs
    site generates from ``lakecast.config.SETTINGS`` (tests/docs checks the built page)."""
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
    generated = "\n".join(s.name for s in lakecast.config.SETTINGS)
    return "\n".join([*(p.read_text() for p in pages), generated])


def test_config_documents_every_variable_it_reads():
    tree = ast.parse(CONFIG.read_text())
    doc = lakecast.config.__doc__ or ""
    assert {"LAKECAST_SERVER_TOKEN", "LAKECAST_SERVER_PORT", "LAKECAST_CRASH_AT"} <= _names(tree)
    undocumented = sorted(n for n in _names(tree) if n not in doc)
    assert not undocumented, f"lakecast.config reads but does not document {undocumented}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_variable_is_resolved_and_documented_in_config_and_the_docs(folder):
    config_names, doc, docs = _names(ast.parse(CONFIG.read_text())), \
        lakecast.config.__doc__ or "", _docs()
    used: dict[str, set[str]] = {}
    for path in _modules(folder):
        for n in _names(ast.parse(path.read_text())):
            used.setdefault(n, set()).add(str(path.relative_to(PROJECT_ROOT)))
    problems = [f"{n} ({', '.join(sorted(where))}): "
                + ", ".join(what for what, ok in (("not read by lakecast.config",
                                                    n in config_names),
                                                   ("no default in its docstring", n in doc),
                                                   ("not in docs/ or README.md", n in docs))
                            if not ok)
                for n, where in sorted(used.items())
                if n not in config_names or n not in doc or n not in docs]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_but_config_reads_a_variable_from_the_environment(folder):
    reads = {str(p.relative_to(PROJECT_ROOT)): sorted(r) for p in _modules(folder)
             if (r := _env_reads(ast.parse(p.read_text())))}
    assert not reads, f"read outside lakecast.config (move them there): {reads}"
