"""Delta tables on object storage (``s3a://``, ``s3://``) read without Spark.

One place derives the settings every reader of an object-store lake uses:

- Spark: ``spark.hadoop.fs.s3a.*`` pairs of ``LAKECAST_SPARK_CONF`` (or the defaults file)
  configure S3A when a JVM starts; :func:`~lakecast.spark_conf.s3a_hadoop_conf` gives
  the same pairs as Hadoop keys (``fs.s3a.*``), which an in-process session started
  before them puts in its Hadoop configuration (never as session settings: a Lakecast
  Spark server gets its credentials at start, :mod:`lakecast.server`);
- :func:`storage_options`: the same values for ``deltalake`` (delta-rs) and pyarrow,
  from that Spark conf, else from the ``AWS_*`` environment variables
  (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_REGION``).

Versions come from ``deltalake`` (:func:`latest_version`); the raw commit files that
``deltalake`` does not expose (a commit's ``txn``/``add`` actions) are listed and read
through pyarrow's S3 filesystem with the same options. Errors name the URI and the
setting to fix (:class:`ObjectStoreError`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from lakecast.config import Settings
from lakecast.errors import LakecastError
from lakecast.spark_conf import s3a_hadoop_conf

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

#: schemes read here (Hadoop's ``s3a`` and the plain ``s3``)
SCHEMES = ("s3a", "s3")
#: ``fs.s3a.<key>`` -> delta-rs / object_store option
_FROM_S3A = {
    "endpoint": "AWS_ENDPOINT_URL",
    "access.key": "AWS_ACCESS_KEY_ID",
    "secret.key": "AWS_SECRET_ACCESS_KEY",
    "session.token": "AWS_SESSION_TOKEN",
    "endpoint.region": "AWS_REGION",
}
_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN", "AWS_REGION")
_FIX = ("set spark.hadoop.fs.s3a.endpoint / .access.key / .secret.key / "
        ".path.style.access in LAKECAST_SPARK_CONF (or AWS_ENDPOINT_URL, "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)")


class ObjectStoreError(LakecastError):
    """An object-store table cannot be reached (the message names the URI and the fix)."""


def is_object_store(path: str) -> bool:
    """Whether ``path`` is a URI of a scheme read here."""
    return urlparse(path).scheme in SCHEMES


def options_for(path: str, settings: Settings | None = None) -> dict[str, str] | None:
    """:func:`storage_options` for an object-store ``path``, ``None`` for a local one
    (what ``deltalake``'s ``storage_options`` parameters take)."""
    return storage_options(settings) if is_object_store(path) else None


def storage_options(settings: Settings | None = None,
                    env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``deltalake`` storage options for the object-store lake: the Spark conf's
    ``fs.s3a.*`` values, else the ``AWS_*`` environment variables (see module doc)."""
    env = os.environ if env is None else env
    opts = {k: env[k] for k in _ENV if env.get(k)}
    if "AWS_REGION" not in opts and env.get("AWS_DEFAULT_REGION"):
        opts["AWS_REGION"] = env["AWS_DEFAULT_REGION"]
    s3a = s3a_hadoop_conf(settings)
    for key, opt in _FROM_S3A.items():
        if s3a.get(f"fs.s3a.{key}"):
            opts[opt] = s3a[f"fs.s3a.{key}"]
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint and "://" not in endpoint:  # S3A takes host[:port]; SSL as configured
        ssl = s3a.get("fs.s3a.connection.ssl.enabled", "true").lower() != "false"
        opts["AWS_ENDPOINT_URL"] = endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
    if endpoint and endpoint.startswith("http://"):
        opts["AWS_ALLOW_HTTP"] = "true"
    if s3a.get("fs.s3a.path.style.access", "").lower() == "true":
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    opts.setdefault("AWS_REGION", "us-east-1")
    # Not AWS_S3_ALLOW_UNSAFE_RENAME by default: deltalake >= 1.0 commits a version with a
    # conditional put (If-None-Match), so two writers of a table cannot both write one
    # version; S3 (since 2024), MinIO, R2 and moto support it. It is safe only where a
    # table has one writer at a time (Lakecast's Dagster pools, lakecast_delta_<table>)
    # on a store without conditional writes: the operator opts in with the variable.
    if env.get("AWS_S3_ALLOW_UNSAFE_RENAME"):
        opts["AWS_S3_ALLOW_UNSAFE_RENAME"] = env["AWS_S3_ALLOW_UNSAFE_RENAME"]
    return opts


def read_error(uri: str, e: BaseException) -> ObjectStoreError:
    """The error of a failed object-store read: the URI and the settings to fix."""
    text = re.sub(r"\x1b\[[0-9;]*m|↳", " ", str(e))
    detail = re.sub(r"\s+", " ", text).strip()[:400] or type(e).__name__
    return ObjectStoreError(f"cannot read {uri}: {detail}; check that the endpoint answers "
                            f"and the bucket exists: {_FIX}")


def latest_version(uri: str, settings: Settings | None = None) -> int | None:
    """Newest committed version of the table at ``uri`` (``deltalake``), ``None`` if
    there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return int(DeltaTable(uri, storage_options=storage_options(settings)).version())
    except TableNotFoundError:
        return None
    except OSError as e:
        raise read_error(uri, e) from e


def read_table(uri: str, version: int, columns: list[str] | None = None,
               settings: Settings | None = None) -> pa.Table:
    """The rows of version ``version`` of the table at ``uri`` (``deltalake``)."""
    from deltalake import DeltaTable

    try:
        dt = DeltaTable(uri, version=version, storage_options=storage_options(settings))
        return dt.to_pyarrow_table(columns=columns)
    except OSError as e:
        raise read_error(uri, e) from e


def log_names(uri: str, settings: Settings | None = None) -> list[str]:
    """The file names in the table's ``_delta_log`` (empty: no table there)."""
    import pyarrow.fs as pafs

    fs, key = filesystem(uri, settings)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{key}/_delta_log", allow_not_found=True))
    except OSError as e:
        raise read_error(uri, e) from e
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def table_names(root_uri: str, settings: Settings | None = None) -> list[str]:
    """Names of the Delta tables (folders with a ``_delta_log``) directly under
    ``root_uri``, sorted."""
    import pyarrow.fs as pafs

    fs, key = filesystem(root_uri, settings)
    try:
        if fs.get_file_info(key.split("/", 1)[0]).type == pafs.FileType.NotFound:
            raise ObjectStoreError(f"cannot read {root_uri}: bucket "
                                   f"{key.split('/', 1)[0]!r} does not exist ({_FIX})")
        infos = fs.get_file_info(pafs.FileSelector(key, allow_not_found=True))
    except OSError as e:
        raise read_error(root_uri, e) from e
    dirs = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
    return [d for d in dirs if log_names(f"{root_uri.rstrip('/')}/{d}", settings)]


def read_log_file(uri: str, name: str, settings: Settings | None = None) -> str:
    """The text of ``_delta_log/<name>``; :class:`FileNotFoundError` if it is absent."""
    fs, key = filesystem(uri, settings)
    try:
        with fs.open_input_stream(f"{key}/_delta_log/{name}") as f:
            return f.read().decode()
    except FileNotFoundError:
        raise
    except OSError as e:
        if "does not exist" in str(e) or "NoSuchKey" in str(e):
            raise FileNotFoundError(f"{uri}/_delta_log/{name}") from e
        raise read_error(uri, e) from e


def filesystem(uri: str, settings: Settings | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow's S3 filesystem of ``uri`` (the lake's options) and the uri's path in it
    (``bucket/key``)."""
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES or not parsed.netloc:
        raise ObjectStoreError(f"{uri}: not an s3a:// or s3:// URI with a bucket")
    opts = storage_options(settings)
    return _s3(tuple(sorted(opts.items()))), f"{parsed.netloc}{parsed.path.rstrip('/')}"


@lru_cache(maxsize=8)
def _s3(opts: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    o = dict(opts)
    endpoint = o.get("AWS_ENDPOINT_URL", "")
    scheme, _, host = endpoint.partition("://") if endpoint else ("https", "", "")
    return pafs.S3FileSystem(
        access_key=o.get("AWS_ACCESS_KEY_ID"), secret_key=o.get("AWS_SECRET_ACCESS_KEY"),
        session_token=o.get("AWS_SESSION_TOKEN"), region=o.get("AWS_REGION"),
        endpoint_override=host or None, scheme=scheme,
        force_virtual_addressing=o.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST") == "true",
        allow_bucket_creation=False, allow_bucket_deletion=False,
        connect_timeout=5, request_timeout=30,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3))
