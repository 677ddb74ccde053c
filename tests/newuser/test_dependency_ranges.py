"""Lakecast's dependency ranges (``pyproject.toml``) at both ends: a virtualenv with the
lowest version each range allows on the lowest Python it allows (3.10), and one with the
newest versions uv resolves on the newest Python this machine has (3.13). In each, the
checkout is installed with its ``dagster`` extra (no ``constraints.txt``) and
``range_smoke.py`` loads a Component with no table and runs two batches on tables written
with pandas + ``deltalake`` against a pandas reference. The newest versions on the
project's own Python are the new-user test's (``uv add`` resolves them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests import ROOT

HERE = Path(__file__).resolve().parent
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"

pytestmark = pytest.mark.slow


def lowest_pins() -> list[str]:
    """``name==low`` for every dependency of the engine and the ``dagster`` extra with a
    lower bound (markers kept)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for req in [*project["dependencies"], *project["optional-dependencies"]["dagster"]]:
        spec, _, marker = req.partition(";")
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)$", spec.strip())
        assert m, req
        low = re.search(r">=\s*([0-9][^,\s]*)", m.group(2))
        if low:
            pins.append(f"{m.group(1)}=={low.group(1)}" + (f";{marker}" if marker else ""))
    return pins


def python(minor: str) -> Path:
    """This machine's Python 3.<minor> (pyenv's)."""
    found = sorted(PYENV.glob(f"3.{minor}.*/bin/python3"))
    assert found, f"no Python 3.{minor} under {PYENV}"
    return found[-1]


@pytest.mark.parametrize("end", ["lowest", "newest"])
def test_each_end_of_the_ranges_runs(tmp_path: Path, end: str) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAKECAST_", "PYTHON", "VIRTUAL_ENV", "DAGSTER_", "UV_"))}
    venv = tmp_path / "venv"
    interpreter = python("10") if end == "lowest" else python("13")
    subprocess.run([uv, "venv", "-q", "--python", str(interpreter), str(venv)], check=True,
                   env=env, cwd=tmp_path)
    pins = lowest_pins() if end == "lowest" else []
    proc = subprocess.run([uv, "pip", "install", "-q", "--python", str(venv),
                           f"{ROOT}[dagster]", *pins], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    project = tmp_path / "project"
    (project / "src" / "payments").mkdir(parents=True)
    shutil.copy(HERE / "project" / "fx.py", project / "src" / "payments" / "fx.py")
    env.update(LAKECAST_HOME=str(project), PYTHONPATH=str(project / "src"),
               DAGSTER_HOME=str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    setup = subprocess.run([str(venv / "bin" / "lakecast"), "setup"], env=env, cwd=project,
                           capture_output=True, text=True, timeout=900)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
    smoke = subprocess.run([str(venv / "bin" / "python"), str(HERE / "range_smoke.py")],
                           env=env, cwd=project, capture_output=True, text=True,
                           timeout=900)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-5000:]
    said = smoke.stdout.strip().splitlines()[-1]
    print(f"\n{end}: {said}")
    assert said.startswith("ok ")
    if end == "lowest":
        for pin in pins:
            name, low = pin.split(";")[0].split("==")
            if name in said:
                assert f"{name}=={low}" in said, (pin, said)
        assert "python==3.10." in said
    else:
        assert "python==3.13." in said
