"""Shared fixtures: one Spark session per test run, a temporary lake per test, and one
Lakecast Spark server (Spark Connect) per test run for the tests marked ``connect``.

Once a process holds a Spark Connect session, PySpark resolves every DataFrame function
to its Spark Connect implementation, so the in-process session cannot be used any more:
the ``connect`` tests run last (:func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from jobs.instance import ensure_instance
from lakecast.config import Settings, get_settings


def pytest_collection_modifyitems(config, items) -> None:
    """Run the Spark Connect tests after every in-process Spark test."""
    items.sort(key=lambda item: item.get_closest_marker("connect") is not None)


@pytest.fixture(scope="session")
def spark_server():
    """One Lakecast Spark server for the test run (a free port on 127.0.0.1)."""
    import socket

    from lakecast.server import Server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(get_settings(), "127.0.0.1", port)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cluster():
    """A local Spark standalone cluster for the test run: a master, two workers (1 core
    each) and its own Lakecast Spark server as driver, on free ports of 127.0.0.1 (not the
    test run's server). Its clients are Spark Connect tests (marker ``cluster``)."""
    from lakecast.cluster import Cluster
    from tests.lakecast.cluster_helpers import free_port

    c = Cluster(get_settings(), port=free_port(span=6), server_port=free_port())
    try:
        c.up(workers=2)
        yield c
    finally:
        c.down()
        assert c.processes() == []


@pytest.fixture
def server_url(spark_server) -> str:
    """The URL of the test run's Lakecast Spark server, for a job run in a subprocess
    (``LAKECAST_SPARK_REMOTE`` in that process's environment only): the job attaches to
    the server as a Spark Connect client, as runs do under ``make ui``, instead of starting
    a JVM of its own. This process keeps its in-process session."""
    return spark_server.url


@pytest.fixture
def connect_lake(lake, spark_server, monkeypatch) -> Iterator[Settings]:
    """A fresh lake whose Spark is the test run's Lakecast Spark server."""
    monkeypatch.setenv("LAKECAST_SPARK_REMOTE", spark_server.url)
    yield get_settings()


@pytest.fixture
def connect_spark(connect_lake):
    """A Spark Connect session of its own on the test run's server."""
    from lakecast.spark import get_spark

    return get_spark(settings=connect_lake)


@pytest.fixture(params=["in_process", pytest.param("connect", marks=pytest.mark.connect)])
def any_spark(request):
    """Runs a test twice: on the test run's in-process session, then (with the ``connect``
    tests, last) on a Spark Connect session of the test run's Lakecast Spark server."""
    if request.param == "connect":
        return request.getfixturevalue("connect_spark")
    return request.getfixturevalue("spark")


@pytest.fixture(scope="session")
def spark():
    """The test run's single Spark session, from Lakecast's own factory."""
    from lakecast.spark import get_spark

    session = get_spark(app_name="lakecast-tests")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path, monkeypatch) -> Iterator[Settings]:
    """Settings whose lake, checkpoints and Dagster home live in a fresh temp folder."""
    monkeypatch.setenv("LAKECAST_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    settings = get_settings()
    ensure_instance(settings)
    assert os.environ["LAKECAST_LAKE_ROOT"] == settings.lake_root
    yield settings
