"""Payments in several currencies, converted to EUR with the FX rates table."""

import pyarrow as pa
import pyarrow.compute as pc

from lakecast import Enrichment, Lookup


class ToEur(Enrichment):
    """Each payment with its currency's rate and amount_eur; unknown currencies go to
    the unmatched side output."""

    transform_reads = ("amount", "rate_to_eur")  # all transform needs: the rest stays in Spark

    def __init__(self) -> None:
        super().__init__([Lookup("fx_rates", key="currency", columns=["rate_to_eur"],
                                 on_missing="unmatched")])

    def transform(self, batch: pa.RecordBatch, ctx: object) -> pa.RecordBatch:
        amount_eur = pc.multiply(batch.column("amount"), batch.column("rate_to_eur"))
        return batch.append_column("amount_eur", amount_eur)

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return super().output_schema(input_schema).append(pa.field("amount_eur", pa.float64()))
