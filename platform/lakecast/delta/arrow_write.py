"""Small appends without a Spark job: Arrow tables committed with ``deltalake`` (delta-rs).

A micro-batch's outputs and its progress-log rows are small; a Spark Delta write of a few
thousand rows costs ~1.4 s on a warm local session (a job, then the commit and snapshot
update), the same append through delta-rs ~10 ms. Exactly once works as with Spark's
``txnAppId``/``txnVersion``: the commit carries a ``txn`` action, and an append whose
transaction version for the app id is already committed is skipped.

Tables are created, when missing, with the same table properties Lakecast's Spark
sessions give new tables (the Change Data Feed on), so both writers produce the same
tables; the :mod:`lakecast.delta.io` facade re-exports :func:`append_arrow`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakecast.delta.log import CDF_PROPERTY, DeltaIOError, write_handle
from lakecast.delta.objstore import options_for

if TYPE_CHECKING:
    import pyarrow as pa

#: properties of a table this module creates (as ``spark_conf``'s defaults for Spark)
NEW_TABLE_PROPERTIES = {CDF_PROPERTY: "true"}


def _uri(path: str) -> str:
    return path.removeprefix("file://") if path.startswith("file://") else path


def write_failure(what: str, exc: BaseException) -> DeltaIOError:
    """One line naming the table, what failed, its cause and the fix, by the kind of
    failure (the trace stays on the error's ``__cause__``, for the log)."""
    from deltalake.exceptions import CommitFailedError, DeltaProtocolError, SchemaMismatchError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if isinstance(exc, CommitFailedError):
        fix = ("another writer committed to the table at the same time and the commits "
               "conflict; nothing was committed. Run again: a pipeline's batch is redone "
               "exactly once (its transaction id makes a repeated write a no-op); make sure "
               "only one job writes the table (e.g. not the sensor's and the continuous run)")
        kind = "concurrent commit conflict"
    elif isinstance(exc, SchemaMismatchError) or any(
            w in first for w in ("Cast error", "schema", "Schema")):
        fix = ("the rows' columns or types do not match the table's schema: fix the "
               "function's output schema, or migrate the table")
        kind = "schema mismatch"
    elif isinstance(exc, DeltaProtocolError):
        fix = ("the table uses Delta features this writer (delta-rs) cannot write: write "
               "it with Spark, or recreate it without those features")
        kind = "unsupported table protocol"
    elif isinstance(exc, OSError) or "ObjectStore" in first or "Generic" in first:
        fix = ("the storage refused or failed the write: check that the path is writable "
               "and the credentials and network (object stores), then run again")
        kind = "storage error"
    else:
        fix = "see the cause in the log; nothing was committed"
        kind = type(exc).__name__
    return DeltaIOError(f"{what} failed ({kind}: {first}); {fix}.")


def append_arrow(table: pa.Table, path: str, *, txn: tuple[str, int] | None = None,
                 merge_schema: bool = True, user_metadata: str | None = None) -> int | None:
    """Append ``table`` to the Delta table at ``path`` (created if missing); returns the
    version committed, or ``None`` when ``txn=(app_id, version)`` was already committed
    (nothing written). ``merge_schema`` adds new columns as Spark's ``mergeSchema`` does;
    ``user_metadata`` goes to the commit's ``commitInfo.userMetadata`` (as Spark's
    ``userMetadata`` write option)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    uri = _uri(path)
    props = None
    if txn is not None or user_metadata is not None:
        props = CommitProperties(
            app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
            custom_metadata={"userMetadata": user_metadata} if user_metadata else None)
    with write_handle(path) as existing:  # the table's kept handle: no log replay per write
        if existing is not None and txn is not None:
            done = existing.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return None
        try:
            write_deltalake(
                existing if existing is not None else uri, table, mode="append",
                storage_options=None if existing is not None else options_for(path),
                schema_mode="merge" if merge_schema and existing is not None else None,
                configuration=None if existing is not None else NEW_TABLE_PROPERTIES,
                commit_properties=props,
            )
        except Exception as exc:  # delta-rs raises its own types; name the table and the fix
            raise write_failure(f"appending {table.num_rows} rows to the Delta table at {path}",
                                exc) from exc
        if existing is not None:
            return existing.version()  # the write left the handle at its commit
    return DeltaTable(uri, storage_options=options_for(path)).version()


def checkpoint_log(path: str) -> int:
    """Write a log checkpoint (classic Parquet) at the current version of the Delta table at
    ``path`` with delta-rs, so readers replay no JSON commits before it (Spark checkpoints
    only the versions it commits itself, every ten); returns that version."""
    from deltalake import DeltaTable

    table = DeltaTable(_uri(path), storage_options=options_for(path))
    table.create_checkpoint()
    return table.version()


def overwrite_arrow(table: pa.Table, path: str, *, user_metadata: str | None = None,
                    txn: tuple[str, int] | None = None, create: bool = False,
                    replace_schema: bool = False) -> int | None:
    """Replace every row of the Delta table at ``path`` with ``table`` in one commit
    (delta-rs; same schema); returns the version committed, or ``None`` when
    ``txn=(app_id, version)`` was already committed (nothing written, as
    :func:`append_arrow`). ``create``: create the table when it is missing (else that is an
    error). ``replace_schema``: the table takes ``table``'s schema (else it must match).
    ``user_metadata`` as in :func:`append_arrow`."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    uri = _uri(path)
    try:
        existing: DeltaTable | None = DeltaTable(uri, storage_options=options_for(path))
    except TableNotFoundError:
        if not create:
            raise DeltaIOError(f"no Delta table at {path} to overwrite") from None
        existing = None
    if existing is not None and txn is not None:
        done = existing.transaction_version(txn[0])
        if done is not None and done >= txn[1]:
            return None
    props = None
    if txn is not None or user_metadata is not None:
        props = CommitProperties(
            app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
            custom_metadata={"userMetadata": user_metadata} if user_metadata else None)
    try:
        write_deltalake(existing if existing is not None else uri, table, mode="overwrite",
                        storage_options=None if existing is not None else options_for(path),
                        schema_mode="overwrite" if replace_schema and existing is not None
                        else None,
                        configuration=None if existing is not None else NEW_TABLE_PROPERTIES,
                        commit_properties=props)
    except Exception as exc:  # delta-rs raises its own types; name the table and the fix
        raise write_failure(f"overwriting the Delta table at {path} with {table.num_rows} rows",
                            exc) from exc
    return DeltaTable(uri, storage_options=options_for(path)).version()
