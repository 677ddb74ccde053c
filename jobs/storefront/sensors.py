"""``broadcast_versions_sensor``: start a micro-batch of the enrichment when there is work.

The pipeline factory builds it from the enrichment's declaration
(:data:`jobs.storefront.microbatch.ENRICHMENT_DECLARATION`, :mod:`dagster_lakecast.sensor`). Each
tick
reads the newest Delta version of every watched table straight from its ``_delta_log`` (a
directory listing, no Spark, no scan). The cursor holds the versions seen at the last
evaluation; when they are unchanged the tick skips. Otherwise — and whenever the cursor is
missing, from another format, or names other tables — the sensor reads the pipeline's
progress log (without Spark, :func:`lakecast.pipeline.progress.read_position`) and requests
ONE run of ``enrichment_microbatch`` only if there is work:

- a batch was planned and not committed (a crashed run: it must be redone), or
- the events table moved past the last committed batch's ``events_end``.

A batch left planned by a killed run is redone even when no table moves afterwards: with
no run active, an unchanged tick still reads the progress log's position and requests one
redo run for that batch (run key ``<versions key>-redo-<batch id>``).

A broadcast table that changed while no new event arrived is no work (the declaration's
``broadcast_only_runs=False``): the pipeline plans batches from new events only, so the new
version is applied with the next events. The run's ``run_key`` is derived from the version
vector, so Dagster never starts two runs for the same versions. A run of the job still
queued or in progress, an active ``enrichment_continuous`` run (continuous mode,
:mod:`dagster_lakecast.continuous`) or a ``lake_maintenance_job`` run: skip without advancing the
cursor (the instance's tag concurrency limit of 1 also guarantees no overlap). A requested
run processes the versions in its ``lakecast/versions`` tag and ends.

When the events table's version moved (since the cursor and since the newest recorded
observation) the tick also records an observation of the ``events`` source asset whose
data version is that Delta version (:func:`jobs.storefront.microbatch.observe_events`), run or not.
"""

from jobs.storefront.microbatch import ENRICHMENT, ENRICHMENT_PIPELINE
from jobs.storefront.pipeline import pipeline_versions
from lakecast.config import get_settings

__all__ = ["broadcast_versions_sensor", "watched_tables", "watched_versions"]

#: the factory-built sensor of the enrichment (targets ``enrichment_microbatch``)
broadcast_versions_sensor = ENRICHMENT_PIPELINE.sensor


def watched_tables() -> tuple[str, ...]:
    """The events table and the broadcast tables, in the pipeline's order."""
    return (ENRICHMENT.events_table, *ENRICHMENT.broadcast_tables)


def watched_versions() -> dict[str, int | None]:
    """Newest Delta version of the events table and each broadcast table (None: no table)."""
    return pipeline_versions(get_settings())
