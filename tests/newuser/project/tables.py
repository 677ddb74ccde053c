"""The project's own tables, written by its own Dagster assets with pandas and deltalake
(no Lakecast helper, no Change Data Feed): ``fx_rates`` is rewritten whole at each
materialization (a dropped currency is a deleted key, a new column is a schema change),
``payments`` appends."""

import dagster as dg
import pandas as pd
from deltalake import write_deltalake

from dagster_lakecast import LakeResource

CURRENCIES = ("USD", "GBP", "EUR", "JPY", "CHF")


class RatesConfig(dg.Config):
    rates: dict[str, float]
    source: str | None = None  # given: the table gets a column `source`


class PaymentsConfig(dg.Config):
    first: int
    n: int


@dg.asset(kinds={"delta", "pandas"})
def fx_rates(config: RatesConfig, lake: LakeResource) -> None:
    """Today's FX rates to EUR, one row per currency."""
    frame = pd.DataFrame({"currency": list(config.rates),
                          "rate_to_eur": list(config.rates.values())})
    if config.source:
        frame["source"] = config.source
    write_deltalake(lake.table_path("fx_rates"), frame, mode="overwrite",
                    schema_mode="overwrite")


@dg.asset(kinds={"delta", "pandas"})
def payments(config: PaymentsConfig, lake: LakeResource) -> None:
    """New payments, appended."""
    ids = range(config.first, config.first + config.n)
    write_deltalake(lake.table_path("payments"), pd.DataFrame({
        "payment_id": list(ids), "currency": [CURRENCIES[i % 5] for i in ids],
        "amount": [round(10.0 + i * 1.25, 2) for i in ids]}), mode="append")
