"""The new user's own tables (not part of what they write for Lakecast): run with the new
virtualenv's Python from the project folder. ``rates CUR=RATE ...`` upserts FX rates (a new
``fx_rates`` version); ``payments FIRST N`` appends N payments with ids FIRST.. (a new
``payments`` version). Prints the new version. Without arguments, it reads one command a
line from stdin (one Spark start for them all) and prints ``ok`` after each."""

import sys

from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.spark import get_spark

CURRENCIES = ("USD", "GBP", "EUR", "JPY", "CHF")  # CHF has no rate: unmatched


def main(argv: list[str]) -> int:
    spark = get_spark(app_name="new-user-tables")
    settings = get_settings()
    if argv:
        write(spark, settings, argv)
        return 0
    for line in sys.stdin:
        if line.split():
            write(spark, settings, line.split())
        print("ok", flush=True)
    return 0


def write(spark, settings, argv: list[str]) -> None:
    """One command: ``rates CUR=RATE ...`` or ``payments FIRST N``; prints the new version."""
    if argv[0] == "rates":
        rows = [(c, float(r)) for c, r in (a.split("=") for a in argv[1:])]
        df = spark.createDataFrame(rows, "currency string, rate_to_eur double")
        path = settings.table_path("fx_rates")
        if delta_io.table_exists(path):
            delta_io.merge_upsert(spark, df, path, keys=["currency"])
        else:
            delta_io.write(df, path)
    else:
        first, n = int(argv[1]), int(argv[2])
        rows = [(i, CURRENCIES[i % len(CURRENCIES)], round(10.0 + i * 1.25, 2))
                for i in range(first, first + n)]
        path = settings.table_path("payments")
        delta_io.write(spark.createDataFrame(rows, "payment_id long, currency string, "
                                                   "amount double"), path)
    print(delta_io.latest_version(path), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
