"""One pass over what each dependency does for Lakecast, run with the Python of a
virtualenv at one end of the dependency ranges (``test_dependency_ranges.py``), from a
project folder with no table: the Component's definitions load with no table (Dagster);
a user writes the tables with pandas + ``deltalake``; two micro-batch runs (Spark, Delta,
PySpark) around a broadcast overwrite equal a pandas reference from time-travelled
versions. Prints ``ok`` and the versions it ran with."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import dagster as dg
import pandas as pd
from dagster.components.testing import create_defs_folder_sandbox
from deltalake import DeltaTable, write_deltalake

from dagster_lakecast import LakecastPipelineComponent

LAKE = Path.cwd() / "var" / "lake"
DISTS = ("dagster", "dagster-pyspark", "pyspark", "delta-spark", "deltalake", "pyarrow",
         "pandas")


def main() -> int:
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(LakecastPipelineComponent, defs_yaml_contents={
            "type": "dagster_lakecast.LakecastPipelineComponent",
            "attributes": {"name": "fx", "function": "payments.fx:ToEur",
                           "events_table": "payments", "broadcast_tables": ["fx_rates"],
                           "output_table": "payments_eur",
                           "side_outputs": {"unmatched": "payments_unmatched"},
                           "parallelism": 2}})
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            assert not LAKE.exists()
            job = defs.resolve_job_def("fx_microbatch")
            want = []
            with dg.instance_for_test() as instance:
                for i, rates in enumerate(({"USD": 0.9, "EUR": 1.0}, {"USD": 0.95})):
                    write_deltalake(str(LAKE / "fx_rates"), pd.DataFrame(
                        {"currency": list(rates), "rate_to_eur": list(rates.values())}),
                        mode="overwrite")
                    new = pd.DataFrame({"payment_id": [10 * i + k for k in range(4)],
                                        "currency": ["USD", "EUR", "CHF", "USD"],
                                        "amount": [1.0, 2.0, 3.0, 4.5]})
                    write_deltalake(str(LAKE / "payments"), new, mode="append")
                    assert job.execute_in_process(instance=instance).success
                    known = new[new.currency.isin(list(rates))].copy()
                    known["amount_eur"] = known.amount * known.currency.map(rates)
                    want.append(known)
    got = DeltaTable(str(LAKE / "payments_eur")).to_pandas().sort_values("payment_id")
    want_all = pd.concat(want).sort_values("payment_id")
    assert got.payment_id.tolist() == want_all.payment_id.tolist(), (got, want_all)
    assert got.amount_eur.round(9).tolist() == want_all.amount_eur.round(9).tolist()
    print("ok " + " ".join(f"{d}=={version(d)}" for d in DISTS) +
          f" python=={sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
