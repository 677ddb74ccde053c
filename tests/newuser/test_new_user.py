"""A new user adopts Lakecast in a Dagster project of their own, with nothing mocked.

The wheel is built from this repository and installed (with its ``dagster`` extra and the
pinned versions of ``constraints.txt``) into a virtualenv outside the repository, which is
off ``sys.path`` for every command. ``create-dagster`` scaffolds a project; ``dg scaffold
defs`` adds a :class:`~dagster_lakecast.LakecastPipelineComponent`, which the user fills in
(``project/defs.yaml``) next to one module with the function (``project/fx.py``):
payments in several currencies converted to EUR with an FX-rates broadcast table.

Then, through ``dg`` alone: the definitions list the job, sensor, continuous job, assets and
checks; a run enriches a batch; a new FX-rates version applies from the next batch on; a
continuous run picks up a new commit; every output row equals a pandas reference. Bad
``defs.yaml`` files, a missing project folder and a missing Maven each fail with one
message naming the fix.
"""

from __future__ import annotations

import json
import os
import queue
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
USER_FILES = {"fx.py": "src/payments/fx.py", "defs.yaml": "src/payments/defs/fx_payments/defs.yaml"}
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


def user_env(tmp: Path, venv: Path) -> dict[str, str]:
    """The user's shell: the virtualenv first on PATH, no repository on sys.path, no
    Lakecast settings of this test run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAKECAST_", "PYTHON", "DAGSTER_", "VIRTUAL_ENV", "PYSPARK"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               DAGSTER_HOME=str(tmp / "dagster_home"), DAGSTER_DISABLE_TELEMETRY="1")
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


class UserTables:
    """``make_tables.py`` running in the user's virtualenv from the project folder, its
    commands sent one a line on stdin: one Spark start for every table version the test
    writes (a process of its own per version took ~20 s each)."""

    def __init__(self, python: Path, project: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "make_tables.py")], cwd=project, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"))
        self.lines = lines_of(self.proc.stdout)

    def __call__(self, *args: str, timeout: float = 600) -> int:
        """Run one command (``rates USD=0.9 ...``, ``payments FIRST N``); its new version."""
        try:
            self.proc.stdin.write(" ".join(args) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: said below
        said: list[str] = []
        deadline = time.monotonic() + timeout
        while not said or said[-1] != "ok":
            line = next_line(self.lines, deadline)
            if not line:
                pytest.fail(f"make_tables.py {' '.join(args)}: no answer (exit "
                            f"{self.proc.poll()}):\n{''.join(said)}\n"
                            f"{self.log.read_text()[-4000:]}")
            said.append(line.strip())
        return int(said[-2])

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def reference(payments: pd.DataFrame, rates: dict[str, float]) -> pd.DataFrame:
    """What the pipeline must write for ``payments`` at ``rates`` (pandas)."""
    known = payments[payments.currency.isin(list(rates))].copy()
    known["rate_to_eur"] = known.currency.map(rates)
    known["amount_eur"] = known.amount * known.rate_to_eur
    return known


def payments_frame(first: int, n: int) -> pd.DataFrame:
    """The payments ``make_tables.py payments FIRST N`` writes."""
    cur = ("USD", "GBP", "EUR", "JPY", "CHF")
    ids = list(range(first, first + n))
    return pd.DataFrame({"payment_id": ids, "currency": [cur[i % 5] for i in ids],
                         "amount": [round(10.0 + i * 1.25, 2) for i in ids]})


def table(project: Path, name: str) -> pd.DataFrame:
    return DeltaTable(str(project / "var" / "lake" / name)).to_pandas()


def assert_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    cols = ["payment_id", "currency", "amount", "rate_to_eur", "amount_eur"]
    g = got[cols].sort_values("payment_id").reset_index(drop=True)
    w = want[cols].sort_values("payment_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)


def test_a_new_user_declares_and_runs_a_pipeline(tmp_path: Path, request) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is part of the dev dependencies"
    timings: dict[str, float] = {}
    base = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}

    # the wheel: both packages and their package data, nothing of this repository's project
    run([uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(ROOT)], tmp_path,
        base)
    wheel = next((tmp_path / "dist").glob("lakecast-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for part in ("lakecast/defaults/pom.xml", "lakecast/defaults/spark-defaults.conf",
                 "lakecast/defaults/log4j2.properties", "dagster_lakecast/__init__.py",
                 "lakecast/jvm/java/lakecast/jvm/StateLookup.java",
                 "dagster_lakecast/component.py"):
        assert part in names, part
    assert not [n for n in names if n.split("/")[0] in ("jobs", "assets", "tests", "deploy")]

    # without the extra, no Dagster distribution is installed (a dry run, in the background
    # while the user's virtualenv below is installed)
    run([uv, "venv", "-q", "--python", sys.executable, str(tmp_path / "bare")], tmp_path, base)
    dry_cmd = [uv, "pip", "install", "--dry-run", "--python", str(tmp_path / "bare"),
               "-c", str(ROOT / "constraints.txt"), str(wheel)]
    dry = subprocess.Popen(dry_cmd, cwd=tmp_path, env=base, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        # the user's virtualenv: the wheel with its dagster extra
        venv = tmp_path / "venv"
        t_start = time.monotonic()
        run([uv, "venv", "-q", "--python", sys.executable, str(venv)], tmp_path, base)
        run([uv, "pip", "install", "-q", "--python", str(venv), "-c",
             str(ROOT / "constraints.txt"), f"{wheel}[dagster]"], tmp_path, base, timeout=1200)
        env = user_env(tmp_path, venv)
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

    # a new Dagster project, installed into the virtualenv as a user would
    run([uv, "tool", "run", "--from", CREATE_DAGSTER, "create-dagster", "project", "payments",
         "--no-uv-sync"], tmp_path, env)
    project = tmp_path / "payments"
    run([uv, "pip", "install", "-q", "--python", str(venv), "--no-deps", "-e", str(project)],
        tmp_path, env)
    setup = run(["lakecast", "setup"], project, env)
    assert "JARs ready" in setup.stdout
    assert "JVM lookup JAR: " in setup.stdout and "not built" not in setup.stdout  # javac
    # the user's own tables (their data, not part of what they write for Lakecast): their
    # script's Spark starts now, beside the scaffolding
    tables = UserTables(venv / "bin" / "python", project, env, tmp_path / "tables.log")
    request.addfinalizer(tables.close)

    # dg scaffolds the component; the user fills in defs.yaml and writes the function
    run(["dg", "scaffold", "defs", COMPONENT, "fx_payments"], project, env)
    scaffolded = (project / USER_FILES["defs.yaml"]).read_text()
    assert f"type: {COMPONENT}" in scaffolded and "function:" in scaffolded
    user_lines = 0
    for src, dst in USER_FILES.items():
        text = (HERE / "project" / src).read_text()
        (project / dst).write_text(text)
        user_lines += len([line for line in text.splitlines() if line.strip()])
    print(f"\nuser-written lines (YAML + Python, non-blank): {user_lines}")
    assert user_lines <= 40

    rates0 = {"USD": 0.9, "GBP": 1.15, "EUR": 1.0, "JPY": 0.0062}
    tables("rates", *(f"{c}={r}" for c, r in rates0.items()))
    tables("payments", "0", "20")

    run(["dg", "check", "defs"], project, env)
    listed = json.loads(run(["dg", "list", "defs", "--json"], project, env).stdout)
    jobs = {j["name"] for j in listed["jobs"]}
    assert {"fx_microbatch", "fx_continuous", "fx_maintenance_job"} <= jobs, jobs
    assert {s["name"] for s in listed["sensors"]} == {"fx_sensor"}
    assert {s["name"] for s in listed["schedules"]} == {"fx_maintenance"}
    assets = {a["asset_key"] for a in listed["assets"]}
    assert {"payments_eur", "payments_unmatched", "fx_progress", "fx_snapshots"} <= assets
    checks = {c["name"] for c in listed["asset_checks"]}
    assert {"counts_reconcile", "broadcast_versions_accepted", "events_fresh"} <= checks

    # a run enriches a batch
    run(["dg", "launch", "--job", "fx_microbatch"], project, env)
    timings["empty folder to first enriched batch"] = time.monotonic() - t_start
    first = payments_frame(0, 20)
    assert_rows(table(project, "payments_eur"), reference(first, rates0))

    # a new FX-rates version applies from the next batch on
    rates1 = {**rates0, "USD": 0.95}
    tables("rates", "USD=0.95")
    tables("payments", "20", "10")
    run(["dg", "launch", "--job", "fx_microbatch"], project, env)
    second = payments_frame(20, 10)
    want = pd.concat([reference(first, rates0), reference(second, rates1)])
    assert_rows(table(project, "payments_eur"), want)

    # a continuous run picks up a new commit
    config = {"ops": {"fx_continuous_loop": {"config": {
        "max_batches": 1, "max_seconds": 180, "poll_seconds": 0.2}}}}
    continuous = subprocess.Popen(
        ["dg", "launch", "--job", "fx_continuous", "--config-json", json.dumps(config)],
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
        # the commit lands once the run watches the tables
        while not watching():
            assert continuous.poll() is None and time.monotonic() < deadline, (
                "the continuous run never watched the tables")
            time.sleep(0.5)
        tables("payments", "30", "5")
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
    third = payments_frame(30, 5)
    want = pd.concat([want, reference(third, rates1)])
    assert_rows(table(project, "payments_eur"), want)
    every = pd.concat([first, second, third])
    unmatched = table(project, "payments_unmatched")
    assert sorted(unmatched.payment_id) == sorted(every[every.currency == "CHF"].payment_id)
    tables.close()  # the last table version is written
    print("timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

    # bad input: each fails loading the definitions with the file, the field and the fix
    good = (HERE / "project" / "defs.yaml").read_text()
    defs_yaml = project / USER_FILES["defs.yaml"]
    bad = {
        "function": good.replace("payments.fx:ToEur", "payments.nope:ToEur"),
        "broadcast_tables": good.replace("[fx_rates]", "[fx_ratez]"),
        "parallelism": good.replace("parallelism: 2", "parallelism: two"),
        "colour": good.replace("  parallelism: 2", "  parallelism: 2\n  colour: blue"),
    }
    for field, text in bad.items():
        defs_yaml.write_text(text)
        proc = run(["dg", "check", "defs"], project, env, check=False)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, field
        assert field in said and "defs.yaml" in said, (field, said[-3000:])
    defs_yaml.write_text(good)

    # no project folder: a clear error naming LAKECAST_HOME, never a site-packages path
    outside = tmp_path / "no-project"
    outside.mkdir()
    proc = run(["lakecast", "versions"], outside, env, check=False)
    assert proc.returncode == 2 and "LAKECAST_HOME" in proc.stderr, proc.stderr
    assert "site-packages" not in proc.stderr
    # no Maven: one line naming what is missing and how to provide the JARs by hand
    no_mvn = {**env, "PATH": str(venv / "bin"), "LAKECAST_JARS_DIR": str(tmp_path / "jars")}
    proc = run([str(venv / "bin" / "lakecast"), "setup"], project, no_mvn, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Maven" in lines[0] and "LAKECAST_JARS_DIR" in lines[0], lines
