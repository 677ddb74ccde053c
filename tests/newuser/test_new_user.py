"""A new user adopts Lakecast in a Dagster project of their own, with nothing mocked.

The user's path, as the README and the tutorial print it: ``create-dagster`` scaffolds a
project (its own ``pyproject.toml``); the README's install line (``uv add ...``) resolves
Lakecast into it with the project's own uv, without this repository's constraints;
``dg scaffold defs`` adds a :class:`~dagster_lakecast.LakecastPipelineComponent`, which the
user fills in (``project/defs.yaml``) next to one module with the function
(``project/fx.py``). The broadcast and events tables are written by the project's own
Dagster assets with pandas + ``deltalake`` (``project/tables.py``), not by Lakecast.

Then, through ``dg`` alone: the definitions load before any table exists (``dg check
defs``, ``dg list defs``, and ``dg dev``'s asset graph read from its GraphQL); the
user's assets materialize from the CLI; a run enriches a batch, and so does an asset of
the user's own that calls ``run_pipeline`` (the reference page's example, as printed); a
broadcast overwrite, a deleted key and an added column each apply from the next batch
on; a continuous run picks up a new commit; every output row equals a pandas reference
built from time-travelled versions of the user's tables. Bad ``defs.yaml`` files, a
missing input table, a missing project folder and a missing Maven each get one message
naming the fix.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

from tests import ROOT

HERE = Path(__file__).resolve().parent
USER_FILES = {"fx.py": "src/payments/fx.py",
              "defs.yaml": "src/payments/defs/fx_payments/defs.yaml"}
#: the project's own assets (their data, not what they write for Lakecast)
TABLES = ("tables.py", "src/payments/defs/tables.py")
#: where the user puts the docs' run-seam example (an asset of their own, under defs/)
OWN_ASSET = "src/payments/defs/own_asset.py"
#: the newest create-dagster whose scaffolded project resolves on this machine's package
#: index (1.13.28+ pin a dagster that no dagster-dg-cli release here matches)
CREATE_DAGSTER = "create-dagster==1.13.27"
COMPONENT = "dagster_lakecast.LakecastPipelineComponent"

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on an unexpected exit code, fail with its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                    f"{proc.stderr[-4000:]}")
    return proc


def readme_line(command: str) -> str:
    """The README's line that starts with ``command`` (its shell comment dropped); the
    tutorial prints the same line."""
    lines = [line.split("  #")[0].strip() for line in (ROOT / "README.md").read_text()
             .splitlines() if line.strip().startswith(command)]
    assert len(lines) == 1, lines
    assert lines[0] in (ROOT / "docs" / "tutorial.md").read_text(), lines[0]
    return lines[0]


def doc_seam_example() -> tuple[str, str]:
    """The run-seam example of the Dagster reference page (its Python block) and the
    ``dg launch`` selection the page prints for it."""
    page = (ROOT / "docs" / "reference" / "dagster.md").read_text()
    section = page.split("## The run seam", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    launch = re.search(r'`dg launch --assets "([^"]+)"`', re.sub(r"\s+", " ", section))
    assert launch, "the page prints how to launch the example"
    return code, launch.group(1)


def user_env(tmp: Path, uv: str) -> dict[str, str]:
    """The user's shell: uv on PATH, no virtualenv active, no repository on sys.path, no
    Lakecast settings of this test run; ``LAKECAST`` is where they cloned Lakecast."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAKECAST_", "PYTHON", "DAGSTER_", "VIRTUAL_ENV", "PYSPARK",
                                "UV_"))}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if not p.startswith(str(ROOT))]
    env.update(PATH=os.pathsep.join([str(tmp / "bin"), *path]), LAKECAST=str(ROOT),
               DAGSTER_HOME=str(tmp / "dagster_home"), DAGSTER_DISABLE_TELEMETRY="1")
    (tmp / "bin").mkdir(exist_ok=True)
    (tmp / "bin" / "uv").symlink_to(uv)
    (tmp / "dagster_home").mkdir(exist_ok=True)
    return env


def lines_of(stream) -> queue.Queue[str]:
    """The lines of ``stream`` as a thread reads them; ``""`` once it ends."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str], deadline: float) -> str | None:
    """The next line, ``""`` at the end, ``None`` when ``deadline`` passes first."""
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def dev_asset_graph(uv: str, project: Path, env: dict[str, str],
                    timeout: float = 240) -> dict[str, set[str]]:
    """Start ``uv run dg dev`` on a free loopback port, read each asset's upstream keys from
    its webserver's GraphQL, then stop it (its whole process group)."""
    import signal
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    query = json.dumps({"query": "{ assetNodes { assetKey { path } dependencyKeys { path } } }"})
    proc = subprocess.Popen([uv, "run", "dg", "dev", "-h", "127.0.0.1", "-p", str(port)],
                            cwd=project, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"dg dev exited {proc.returncode}"
            try:
                request = urllib.request.Request(f"{url}/graphql", data=query.encode(),
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=5) as response:
                    nodes = json.loads(response.read())["data"]["assetNodes"]
                if nodes:
                    return {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in
                                                             n["dependencyKeys"]}
                            for n in nodes}
            except (OSError, KeyError, TypeError, ValueError):
                pass
            assert time.monotonic() < deadline, f"dg dev did not serve {url} in {timeout} s"
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Lake:
    """The user's tables, read back with ``deltalake`` (time travel for the reference)."""

    def __init__(self, project: Path) -> None:
        self.root = project / "var" / "lake"

    def version(self, name: str) -> int:
        return DeltaTable(str(self.root / name)).version()

    def at(self, name: str, version: int | None = None) -> pd.DataFrame:
        return DeltaTable(str(self.root / name), version=version).to_pandas()

    def batch_reference(self, events: tuple[int, int], rates_version: int) -> pd.DataFrame:
        """What the pipeline must write for the payments of versions ``events[0]+1 ..
        events[1]`` at ``fx_rates`` version ``rates_version`` (pandas)."""
        new = self.at("payments", events[1])
        if events[0] >= 0:
            new = new[~new.payment_id.isin(self.at("payments", events[0]).payment_id)]
        rates = self.at("fx_rates", rates_version).set_index("currency").rate_to_eur
        known = new[new.currency.isin(rates.index)].copy()
        known["rate_to_eur"] = known.currency.map(rates)
        known["amount_eur"] = known.amount * known.rate_to_eur
        return known


def assert_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    cols = ["payment_id", "currency", "amount", "rate_to_eur", "amount_eur"]
    g = got[cols].sort_values("payment_id").reset_index(drop=True)
    w = want[cols].sort_values("payment_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)


def test_a_new_user_declares_and_runs_a_pipeline(tmp_path: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is part of the dev dependencies"
    timings: dict[str, float] = {}
    env = user_env(tmp_path, uv)

    # the wheel: both packages and their package data, nothing of this repository's
    # project; without the extra, no Dagster distribution (a dry run, in the background)
    run([uv, "build", "-q", "--wheel", "--out-dir", str(tmp_path / "dist"), str(ROOT)],
        tmp_path, env)
    wheel = next((tmp_path / "dist").glob("lakecast-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for part in ("lakecast/defaults/pom.xml", "lakecast/defaults/spark-defaults.conf",
                 "lakecast/defaults/log4j2.properties", "dagster_lakecast/__init__.py",
                 "lakecast/jvm/java/lakecast/jvm/StateLookup.java",
                 "dagster_lakecast/component.py"):
        assert part in names, part
    assert not [n for n in names if n.split("/")[0] in ("jobs", "assets", "tests", "deploy")]
    run([uv, "venv", "-q", "--python", sys.executable, str(tmp_path / "bare")], tmp_path, env)
    dry_cmd = [uv, "pip", "install", "--dry-run", "--python", str(tmp_path / "bare"),
               str(wheel)]
    dry = subprocess.Popen(dry_cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)

    # a new Dagster project, and Lakecast added with the README's line, resolved by uv
    t_start = time.monotonic()
    try:
        run([uv, "tool", "run", "--from", CREATE_DAGSTER, "create-dagster", "project",
             "payments", "--no-uv-sync"], tmp_path, env)
        project = tmp_path / "payments"
        scaffolded = (project / "pyproject.toml").read_text()
        assert 'requires-python = ">=3.10,<3.15"' in scaffolded, scaffolded
        install = readme_line("uv add ")
        run(["bash", "-c", install], project, env, timeout=1200)
        timings["install"] = time.monotonic() - t_start
        dry_out, dry_err = dry.communicate(timeout=600)
    finally:
        if dry.poll() is None:
            dry.kill()
            dry.wait()
    if dry.returncode != 0:
        pytest.fail(f"{' '.join(dry_cmd)} exited {dry.returncode}:\n{dry_out[-4000:]}\n"
                    f"{dry_err[-4000:]}")
    planned = [line.split()[1] for line in (dry_out + dry_err).splitlines()
               if line.strip().startswith("+ ")]
    assert any(p.startswith("pyspark") for p in planned), planned
    assert not [p for p in planned if p.startswith("dagster")], planned
    assert "lakecast" in (project / "pyproject.toml").read_text()

    def dg(*args: str, check: bool = True, timeout: float = 600
           ) -> subprocess.CompletedProcess[str]:
        return run([uv, "run", "dg", *args], project, env, timeout=timeout, check=check)

    setup = run([uv, "run", "lakecast", "setup"], project, env)
    assert "JARs ready" in setup.stdout
    # the wheel uv built from the checkout ships the JAR (this machine has a JDK)
    assert "JVM lookup JAR: " in setup.stdout and "JVM lookup JAR: none" not in setup.stdout

    # dg scaffolds the component; the user fills in defs.yaml and writes the function,
    # beside the project's own assets that write the tables
    dg("scaffold", "defs", COMPONENT, "fx_payments")
    scaffolded = (project / USER_FILES["defs.yaml"]).read_text()
    assert f"type: {COMPONENT}" in scaffolded and "function:" in scaffolded
    user_lines = 0
    for src, dst in USER_FILES.items():
        text = (HERE / "project" / src).read_text()
        (project / dst).write_text(text)
        user_lines += len([line for line in text.splitlines() if line.strip()])
    print(f"\nuser-written lines (YAML + Python, non-blank): {user_lines}")
    assert user_lines <= 40
    shutil.copy(HERE / "project" / TABLES[0], project / TABLES[1])
    # and, beside the Component, an asset of their own that runs a second pipeline's
    # batches through the public seam: the reference page's example as printed
    own_code, own_selection = doc_seam_example()
    (project / OWN_ASSET).write_text(own_code)

    # no table exists yet: the definitions load, the user's assets are upstream of the
    # pipeline's outputs, and they materialize from the CLI
    lake = Lake(project)
    assert not lake.root.exists()
    dg("check", "defs")
    listed = json.loads(dg("list", "defs", "--json").stdout)
    jobs = {j["name"] for j in listed["jobs"]}
    assert {"fx_microbatch", "fx_continuous", "fx_maintenance_job"} <= jobs, jobs
    assert {s["name"] for s in listed["sensors"]} == {"fx_sensor"}
    assert {s["name"] for s in listed["schedules"]} == {"fx_maintenance"}
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert {"payments_eur", "payments_unmatched", "fx_progress", "fx_snapshots",
            "fx_rates", "payments"} <= set(assets)
    assert {"fx_rates", "payments"} <= set(assets["payments_eur"]["dependency_keys"]), assets
    assert {"fx_rates", "payments"} <= set(assets["payments_eur_mine"]["dependency_keys"])
    checks = {c["name"] for c in listed["asset_checks"]}
    assert {"counts_reconcile", "broadcast_versions_accepted", "events_fresh"} <= checks
    # `dg dev` serves that graph, the user's assets upstream of the outputs (no table yet)
    graph = dev_asset_graph(uv, project, env)
    assert {"fx_rates", "payments"} <= graph["payments_eur"], graph
    assert graph["fx_rates"] == set() and graph["payments"] == set()

    def rates(values: dict[str, float], source: str | None = None) -> int:
        config = {"rates": values, **({"source": source} if source else {})}
        dg("launch", "--assets", "fx_rates", "--config-json",
           json.dumps({"ops": {"fx_rates": {"config": config}}}))
        return lake.version("fx_rates")

    def payments(first: int, n: int) -> int:
        dg("launch", "--assets", "payments", "--config-json",
           json.dumps({"ops": {"payments": {"config": {"first": first, "n": n}}}}))
        return lake.version("payments")

    def batch() -> None:
        said = dg("launch", "--job", "fx_microbatch")
        assert "Traceback" not in said.stdout + said.stderr

    want: list[pd.DataFrame] = []
    r0 = rates({"USD": 0.9, "GBP": 1.15, "EUR": 1.0, "JPY": 0.0062})
    p0 = payments(0, 20)
    batch()
    timings["empty folder to first enriched batch"] = time.monotonic() - t_start
    want.append(lake.batch_reference((-1, p0), r0))
    assert_rows(lake.at("payments_eur"), pd.concat(want))
    # the user's own asset: the same batch through run_pipeline, its own log line first
    own = dg("launch", "--assets", own_selection)
    own_said = own.stdout + own.stderr
    assert "Traceback" not in own_said and "my own step before the batches" in own_said, (
        own_said[-3000:])
    assert_rows(lake.at("payments_eur_mine"), want[0])
    every0 = lake.at("payments", p0)
    assert sorted(lake.at("payments_unmatched_mine").payment_id) == sorted(
        every0[~every0.payment_id.isin(want[0].payment_id)].payment_id)

    # each broadcast change applies from the next batch on: an overwrite with a new
    # rate, a deleted key (GBP), an added column
    last = p0
    for change in ({"USD": 0.95, "GBP": 1.15, "EUR": 1.0, "JPY": 0.0062},
                   {"USD": 0.95, "EUR": 1.0, "JPY": 0.0062},
                   {"USD": 0.97, "EUR": 1.0, "JPY": 0.0063, "source": "ecb"}):
        source = change.pop("source", None)
        r = rates(change, source)
        p = payments(100 * (len(want) + 1), 10)
        batch()
        want.append(lake.batch_reference((last, p), r))
        assert_rows(lake.at("payments_eur"), pd.concat(want))
        last = p

    # a continuous run picks up a new commit
    config = {"ops": {"fx_continuous_loop": {"config": {
        "max_batches": 1, "max_seconds": 180, "poll_seconds": 0.2}}}}
    continuous = subprocess.Popen(
        [uv, "run", "dg", "launch", "--job", "fx_continuous", "--config-json",
         json.dumps(config)],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def watching() -> bool:
        """The continuous run's log, in the user's instance, says it watches the tables."""
        ref = InstanceRef.from_dir(str(tmp_path / "dagster_home"))
        with DagsterInstance.from_ref(ref) as instance:
            runs = [r for r in instance.get_runs(limit=1) if r.job_name == "fx_continuous"]
            return bool(runs) and any("task-local state warmed" in (e.user_message or "")
                                      for e in instance.all_logs(runs[0].run_id))

    said: list[str] = []
    lines, deadline = lines_of(continuous.stdout), time.monotonic() + 300
    try:
        while not watching():
            assert continuous.poll() is None and time.monotonic() < deadline, (
                "the continuous run never watched the tables")
            time.sleep(0.5)
        p = payments(900, 5)
        while line := next_line(lines, deadline):
            said.append(line)
        continuous.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if continuous.poll() is None:
            continuous.kill()
            continuous.wait()
        while line := next_line(lines, time.monotonic() + 1):
            said.append(line)
    out = "".join(said)
    assert continuous.returncode == 0, out[-4000:]
    want.append(lake.batch_reference((last, p), lake.version("fx_rates")))
    assert_rows(lake.at("payments_eur"), pd.concat(want))
    every = lake.at("payments")
    matched = pd.concat(want).payment_id
    unmatched = lake.at("payments_unmatched")
    assert sorted(unmatched.payment_id) == sorted(every[~every.payment_id.isin(matched)]
                                                  .payment_id)
    assert set(unmatched.currency) == {"CHF", "GBP"}  # GBP: after its key was deleted
    print("timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

    # bad input: each fails loading the definitions with the file, the field and the fix
    good = (HERE / "project" / "defs.yaml").read_text()
    defs_yaml = project / USER_FILES["defs.yaml"]
    bad = {
        "function": good.replace("payments.fx:ToEur", "payments.nope:ToEur"),
        "parallelism": good.replace("parallelism: 2", "parallelism: two"),
        "colour": good.replace("  parallelism: 2", "  parallelism: 2\n  colour: blue"),
    }
    for field, text in bad.items():
        defs_yaml.write_text(text)
        proc = dg("check", "defs", check=False)
        said_text = proc.stdout + proc.stderr
        assert proc.returncode != 0, field
        assert field in said_text and "defs.yaml" in said_text, (field, said_text[-3000:])
    # a broadcast table that does not exist: the definitions load; a run names the
    # table, its path and what creates it, and processes nothing
    defs_yaml.write_text(good.replace("[fx_rates]", "[fx_ratez]"))
    dg("check", "defs")
    before = lake.version("payments_eur")
    proc = dg("launch", "--job", "fx_microbatch")
    said_text = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert "broadcast table 'fx_ratez'" in said_text, said_text[-3000:]
    assert "dg launch --assets" in said_text and "Traceback" not in said_text
    assert lake.version("payments_eur") == before
    defs_yaml.write_text(good)

    # no project folder: a clear error naming LAKECAST_HOME, never a site-packages path
    outside = tmp_path / "no-project"
    outside.mkdir()
    lakecast = project / ".venv" / "bin" / "lakecast"
    proc = run([str(lakecast), "versions"], outside, env, check=False)
    assert proc.returncode == 2 and "LAKECAST_HOME" in proc.stderr, proc.stderr
    assert "site-packages" not in proc.stderr
    # no Maven: one line naming what is missing and how to provide the JARs by hand
    no_mvn = {**env, "PATH": str(project / ".venv" / "bin"),
              "LAKECAST_JARS_DIR": str(tmp_path / "jars")}
    proc = run([str(lakecast), "setup"], project, no_mvn, check=False)
    lines_said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines_said) == 1, proc.stderr
    assert "Maven" in lines_said[0] and "LAKECAST_JARS_DIR" in lines_said[0], lines_said
