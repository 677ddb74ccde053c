"""Run tags and run config shared by every job the factory builds."""

#: run tag that the run queue limits to one run per value (``tag_concurrency_limits`` in
#: ``dagster.yaml``): every writer of a pipeline carries its micro-batch job's name
EXCLUSIVE_TAG = "lakecast/exclusive"
#: run tag with the table versions a sensor-requested run processes (JSON: table -> version)
VERSIONS_TAG = "lakecast/versions"
#: default run config of the frequent jobs: their runs print only warnings and errors to the
#: terminal of ``dagster dev`` (the default prints every event, ~20 lines a run); every event
#: and log line is still stored and shown on the run's page. A launch may override it.
QUIET_RUN_LOGS = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
