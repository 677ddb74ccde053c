"""The engine's layers hold in its imports (no Spark; reads files, imports nothing).

The layer order is not written here: it is read from the layout block of
``docs/architecture.md`` (the rows under ``platform/lakecast/``, top first), so the page
and this test cannot drift. Every import of every module under ``platform/lakecast``
counts: top-level, inside functions and under ``TYPE_CHECKING`` alike (an annotation-only
import still names a layer below, and no module needs one today).

``platform/dagster_lakecast`` imports ``lakecast`` only through public names: no
underscore module, no underscore name imported or read off a ``lakecast`` module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "platform" / "lakecast"
INTEGRATION = ROOT / "platform" / "dagster_lakecast"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PKG = "lakecast"


@dataclass(frozen=True)
class Import:
    """One import of a ``lakecast`` module: the module it binds and where it is."""

    target: str
    line: int
    names: tuple[str, ...] = ()


def documented_layers(text: str) -> list[tuple[str, ...]]:
    """The layers of the layout block, top first: each row's first column under
    ``platform/lakecast/`` names modules (``x.py``) and packages (``x/``) of one layer."""
    block = re.search(r"## Code layout.*?```text\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no layout block under '## Code layout'"
    layers: list[tuple[str, ...]] = []
    inside = False
    for row in block.group(1).splitlines():
        if not row.startswith(" "):  # a top-level entry: the engine's part or another
            inside = row.split()[0] == f"platform/{PKG}/" if row.strip() else inside
            continue
        if not inside or row.startswith("   "):  # a description's continuation
            continue
        column = re.split(r"\s{2,}", row.strip())[0]
        layers.append(tuple(f"{PKG}." + t.removesuffix(".py").removesuffix("/")
                            for t in column.split()))
    assert layers, "the layout block lists no row under platform/lakecast/"
    return layers


def modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: dict[str, Path]) -> list[Import]:
    """Every import of a ``lakecast`` module in ``path`` (module ``name``), anywhere in
    the file; ``from a import b`` binds ``a.b`` when that is a module, else ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, node.lineno) for a in node.names
                      if a.name.split(".")[0] == PKG]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != PKG:
                continue
            plain = tuple(a.name for a in node.names if f"{base}.{a.name}" not in known)
            found += [Import(f"{base}.{a.name}", node.lineno) for a in node.names
                      if f"{base}.{a.name}" in known]
            if plain:
                found.append(Import(base, node.lineno, plain))
    return found


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
    """The row of ``module`` in the layout block (a package's row covers its modules)."""
    for i, row in enumerate(layers):
        if any(module == entry or module.startswith(entry + ".") for entry in row):
            return i
    return None


LAYERS = documented_layers(ARCHITECTURE.read_text(encoding="utf-8"))
ENGINE_MODULES = modules(ENGINE)


def test_the_layout_block_names_every_module_of_the_engine_and_nothing_else():
    unplaced = [m for m in ENGINE_MODULES if m != PKG and layer_of(m, LAYERS) is None]
    assert unplaced == [], f"modules in no row of docs/architecture.md: {unplaced}"
    stale = [e for row in LAYERS for e in row if e not in ENGINE_MODULES]
    assert stale == [], f"rows of docs/architecture.md that name no module: {stale}"


def test_no_import_runs_up_the_layers():
    upward = []
    for name, path in ENGINE_MODULES.items():
        if name == PKG:  # the facade re-exports the user API; nothing imports it (below)
            continue
        mine = layer_of(name, LAYERS)
        assert mine is not None, name
        for imp in imports(path, name, ENGINE_MODULES):
            theirs = layer_of(imp.target, LAYERS)
            if imp.target == PKG:
                upward.append(f"{path.relative_to(ROOT)}:{imp.line} imports the package "
                              f"facade ({', '.join(imp.names)}): import the module instead")
            elif theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{imp.line} ({LAYERS[mine][0]}) "
                              f"imports {imp.target} ({LAYERS[theirs][0]}, a layer below)")
    assert upward == [], "imports that run up the layers:\n" + "\n".join(upward)


def test_the_layer_rule_sees_function_level_and_type_checking_imports(tmp_path):
    """The checker's own reach: an import inside a function or under TYPE_CHECKING counts."""
    mod = tmp_path / PKG / "api" / "probe.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from lakecast.runtime import keyed\n"
                   "def f():\n    from lakecast.delta import io\n    import lakecast.build\n")
    known = {**ENGINE_MODULES, "lakecast.api.probe": mod}
    found = {i.target for i in imports(mod, "lakecast.api.probe", known)}
    assert found == {"lakecast.runtime.keyed", "lakecast.delta.io", "lakecast.build"}
    assert all(layer_of(t, LAYERS) > layer_of("lakecast.api.probe", LAYERS) for t in found)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_dagster_integration_uses_only_public_names_of_the_engine():
    reach_ins = []
    for name, path in modules(INTEGRATION).items():
        bound: set[str] = set()  # local names bound to lakecast modules
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = path.relative_to(ROOT)
        for imp in imports(path, name, ENGINE_MODULES):
            parts = imp.target.split(".")
            if any(private(p) for p in parts):
                reach_ins.append(f"{where}:{imp.line} imports {imp.target}")
            reach_ins += [f"{where}:{imp.line} imports {imp.target}.{n}"
                          for n in imp.names if private(n)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound |= {(a.asname or a.name.split(".")[0]) for a in node.names
                          if a.name.split(".")[0] == PKG}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PKG):
                bound |= {a.asname or a.name for a in node.names
                          if f"{node.module}.{a.name}" in ENGINE_MODULES}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in bound:
                    reach_ins.append(f"{where}:{node.lineno} reads {base.id}...{node.attr}")
    assert reach_ins == [], "private names of lakecast used by dagster_lakecast:\n" + \
        "\n".join(reach_ins)
