"""Dagster resources shared by assets and jobs."""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from dagster_pyspark import PySparkResource

from lakecast.config import Settings, get_settings
from lakecast.spark import get_spark


class LakecastSparkResource(PySparkResource):
    """dagster-pyspark's ``PySparkResource``, built by Lakecast's one session factory.

    ``spark_config`` entries override the factory's configuration (see
    :mod:`lakecast.config`), so the session always has Delta and the local JARs. With
    ``LAKECAST_SPARK_REMOTE`` set the run attaches to the Lakecast Spark server:
    :attr:`spark_session` is a session of the run's own (batch assets), and
    :meth:`session_for` the stable server-side session of a pipeline, shared by all its
    runs, so its task-local broadcast state stays warm from one run to the next.
    """

    spark_config: dict[str, Any] = {}

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._spark_session = None  # created on first use: a pipeline run needs only its own

    def _overrides(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.spark_config.items()}

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            self._spark_session = get_spark(self._overrides(), app_name="lakecast-dagster")
        return self._spark_session

    def session_for(self, pipeline: str) -> Any:
        """The Spark session of ``pipeline``'s runs (in-process: the process's session)."""
        return get_spark(self._overrides(), app_name="lakecast-dagster",
                         session=f"pipeline:{pipeline}")


class LakeResource(ConfigurableResource):
    """Where the lake is. Empty fields fall back to :func:`lakecast.config.get_settings`."""

    lake_root: str = ""
    checkpoint_root: str = ""

    def settings(self) -> Settings:
        env = {}
        if self.lake_root:
            env["LAKECAST_LAKE_ROOT"] = self.lake_root
        if self.checkpoint_root:
            env["LAKECAST_CHECKPOINT_ROOT"] = self.checkpoint_root
        import os

        return get_settings({**os.environ, **env})

    def table_path(self, name: str) -> str:
        return self.settings().table_path(name)
