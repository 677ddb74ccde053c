"""Task-local broadcast state in the executor JVM: the default for a pure ``enrich(Lookup...)``.

A pure :func:`~lakecast.api.enrich.enrich` (no hook of its own) needs no Python in the
tasks, and an :class:`~lakecast.api.enrich.Enrichment` overriding only ``transform`` /
``output_schema`` needs it only for its transform (run after the lookups,
:mod:`lakecast.runtime.lookup_transform`). With ``execution="tasks"`` (the default) their
lookups run in the
executor JVM, in :mod:`lakecast.jvm`'s ``StateLookup`` Java UDF, against a state each
executor JVM keeps warm between batches, built from the same chain of broadcast elements
the Python workers apply (:mod:`lakecast.runtime.broadcast`):

* the driver writes each chain link's elements as Arrow IPC files, one per table and
  version (``<table>-v<version>-t<commit ms>.full.arrow`` replaces the state,
  ``.changes.arrow`` applies a version's changes), under
  ``<state root>/<function id>/<lookup digest>/`` (``LAKECAST_JVM_STATE_ROOT``, by default
  ``<checkpoint root>/_jvm-state``: a local folder or a ``s3a://`` URI, written through
  :class:`~lakecast.runtime.jvm_files.StateFiles`), and per table a *manifest*: the state's
  lineage, then its chain's files in order (URIs);
* executors read them through Hadoop's ``FileSystem`` with the cluster's configuration:
  executor memory is a cache of the chain, and a new or restarted executor rebuilds from it;
* each lookup is ``StateLookup(manifest, key)``: an executor JVM that holds the lineage at
  an earlier link applies only the files after it; a cold one (a new executor, or a new
  runtime) reads the base. The run's state version is fixed on the driver before the job,
  as a literal of the manifest, so a retried task computes the same result;
* defaults, routing of misses, side outputs and lineage are those of
  :class:`~lakecast.runtime.lookup_plan.LookupPlan`, built once per runtime and events
  schema: a run only adds its lookups' calls, whose manifests name its version;
* the accounting is measured where the state lives: the run's observation collects, per
  task and lookup, a ``StateStats`` row (executor, JVM, cold or warm, build time, state
  bytes, evictions), and :meth:`JvmLookups.holders` makes one accounting row per executor
  JVM of them, so the budget counts every copy.

Not available (said once, with the reason; the lookups then run in the Python workers):
the JAR is not there (see :mod:`lakecast.jvm.build`), the session was started without it,
or a key or value column has a type the JVM state does not hold (keys: integers, strings,
booleans, decimals; values: those plus floats, dates, timestamps, binary). Executors read the
state root with the cluster's credentials: on a cluster without a shared disk, put it (and
the checkpoints) on the object store.

Files are removed: a rebase prunes the old chain's files; an ephemeral runtime's folder goes
at :meth:`JvmLookups.close`; at a runtime's start, the folders untouched for a day of
ephemeral runtimes a process left behind and of the function's older identities (its code
changed) go too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.element import CHANGE_TYPE, BroadcastElement
from lakecast.api.enrich import Enrichment, Lookup
from lakecast.runtime.jvm_files import StateFiles
from lakecast.runtime.lookup_plan import JoinedResult, LookupPlan
from lakecast.runtime.metrics import TaskMetrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.runtime.tasks import ChainLink

log = logging.getLogger(__name__)

#: ``TaskMetrics.cache`` of a run whose lookups ran in the executor JVM
JVM_CACHE = "jvm"
_SAID: set[str] = set()
#: the registered name of the ``StateStats`` UDF
_STATS = "lakecast_state_stats"
#: the lookup UDFs registered per session (by the name of their value type)
_REGISTERED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def say_once(reason: str) -> None:
    """Log, once per process and reason, why pure lookups run in the Python workers."""
    if reason not in _SAID:
        _SAID.add(reason)
        log.warning("JVM lookups are off: %s; pure enrich(Lookup...) functions run in the "
                    "Python workers", reason)


def unavailable(spark: SparkSession) -> str | None:
    """Why the session cannot run the JVM lookup (``None``: it can)."""
    from lakecast.jvm.build import JAR_NAME, built_jar

    jar = built_jar()
    if jar is None:
        return "the JVM lookup JAR is not built (run `lakecast setup` with a JDK)"
    try:
        jars = spark.conf.get("spark.jars", "") or ""
    except Exception as e:
        return f"the session's spark.jars cannot be read ({type(e).__name__})"
    if JAR_NAME not in jars:
        return ("this Spark session was started without the JVM lookup JAR (start it with "
                "lakecast.spark.get_spark, or restart the Lakecast Spark server after "
                "`lakecast setup`)")
    from lakecast.jvm.probe import load_problem

    return load_problem(spark)  # a JAR it cannot load (e.g. damaged): the path and fix


def _key_ok(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal128(t))


def _value_ok(t: pa.DataType) -> bool:
    return (_key_ok(t) or pa.types.is_floating(t) or pa.types.is_date32(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or (pa.types.is_timestamp(t) and t.unit == "us") or pa.types.is_null(t))


def not_in_jvm(function: Enrichment, schemas: Mapping[str, pa.Schema],
               events: pa.Schema) -> str | None:
    """Why these lookups' columns cannot be held by the JVM state (``None``: they can)."""
    for lk in function.lookups:
        schema = schemas.get(lk.table)
        if schema is None:
            return f"table {lk.table!r} has no schema yet"
        for e, s in lk.key_pairs:
            if s not in schema.names or e not in events.names:
                return f"Lookup({lk.table!r}) key {e}->{s} is missing"
            st, et = schema.field(s).type, events.field(e).type
            if not _key_ok(st):
                return f"Lookup({lk.table!r}) key column {s!r} is {st}"
            both_int = pa.types.is_integer(st) and pa.types.is_integer(et)
            both_str = (pa.types.is_string(st) or pa.types.is_large_string(st)) and (
                pa.types.is_string(et) or pa.types.is_large_string(et))
            if not (both_int or both_str or st == et):
                return f"Lookup({lk.table!r}) key {e!r} is {et} in the events, {st} in the table"
        for s, _ in lk.column_pairs(schema):
            if s not in schema.names:
                return f"Lookup({lk.table!r}) column {s!r} is missing"
            if not _value_ok(schema.field(s).type):
                return f"Lookup({lk.table!r}) column {s!r} is {schema.field(s).type}"
    return None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)[:120]


def _sweep(files: StateFiles, current: str, older_than_s: float = 86_400.0) -> None:
    """Remove the folders, untouched for a day, of ephemeral runtimes (no ``@`` in the id)
    a process did not close, and of older identities of ``current``'s function (same name
    before the ``@``, another code digest: a deploy of new code)."""
    import time

    cutoff = time.time() - older_than_s
    name_of = current.partition("@")[0] + "@"
    try:
        folders = files.folders()
    except OSError:
        return
    for name, mtime in folders:
        stale = "@" not in name or (name.startswith(name_of) and name != current)
        if stale and mtime < cutoff:
            files.remove_folder(name)


def _value_type(schema: pa.Schema, pairs: Sequence[tuple[str, str]]) -> Any:
    """The lookup UDF's result type: the looked-up columns as ``v0, v1, ...``."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f"v{j}", from_arrow_type(schema.field(s).type, False))
                       for j, (s, _) in enumerate(pairs)])


def _columns(i: int, lk: Lookup, pairs: list[tuple[str, str]]) -> tuple[Any, list[Any]]:
    """Lookup ``i``'s miss and values on the frame its call added (``__lk<i>``, a struct
    that is null where the key has no row)."""
    from pyspark.sql import functions as F

    found = F.col(f"__lk{i}")
    return found.isNull(), [found.getField(f"v{j}") for j in range(len(pairs))]


class JvmLookups:
    """The state files of one runtime's chain and the planning of its JVM lookups."""

    def __init__(self, files: StateFiles, function_id: str, function: Enrichment,
                 ephemeral: bool) -> None:
        self.function = function
        self.files = files
        #: this runtime's folder under the state root
        self.folder = _safe(function_id)
        #: a runtime of its own (no stable function id): :meth:`close` removes its files,
        #: and executors then drop its state
        self.ephemeral = ephemeral
        self._written: dict[int, dict[str, list[str]]] = {}  # id(link) -> table -> names
        self._plan = LookupPlan(function, _columns, JVM_CACHE)
        #: per executor JVM, its LRU's evictions when a run last reported it
        self._evictions: dict[str, int] = {}
        _sweep(files, self.folder)

    @property
    def root(self) -> str:
        """This runtime's folder as executors read it (a URI)."""
        return self.files.uri(self.folder)

    def _lookup_folder(self, lk: Lookup, schema: pa.Schema) -> str:
        spec = json.dumps([lk.table, lk.key_pairs, lk.column_pairs(schema),
                           [str(schema.field(s).type) for s, _ in lk.column_pairs(schema)]])
        return f"{self.folder}/{hashlib.sha256(spec.encode()).hexdigest()[:12]}"

    def _write_element(self, lk: Lookup, schema: pa.Schema, e: BroadcastElement) -> str:
        # the commit's time tells a recreated table's version from the old table's
        name = (f"{self._lookup_folder(lk, schema)}/{_safe(lk.table)}-v{e.version}"
                f"-t{e.commit_timestamp}.{e.kind}.arrow")
        if self.files.exists(name):  # same table commit, kind and columns: the same rows
            return name
        rows = e.rows
        keys = [s for _, s in lk.key_pairs]
        columns = [pa.compute.cast(rows.column(k), pa.int64())
                   if pa.types.is_integer(rows.schema.field(k).type) else rows.column(k)
                   for k in keys]
        names = [f"k{j}" for j in range(len(keys))]
        for j, (s, _) in enumerate(lk.column_pairs(schema)):
            columns.append(rows.column(s).cast(schema.field(s).type))
            names.append(f"v{j}")
        if e.kind == "changes":
            columns.append(rows.column(CHANGE_TYPE))
            names.append(CHANGE_TYPE)
        table = pa.table(columns, names=names).replace_schema_metadata(
            {"lakecast.keys": str(len(keys)), "lakecast.rows": str(rows.num_rows)})
        self.files.write_arrow(name, table)
        return name

    def manifests(self, chain: Sequence[ChainLink],
                  schemas: Mapping[str, pa.Schema]) -> dict[str, str]:
        """Per lookup table, the URI of the manifest of its state at the end of ``chain``
        (the files of links not written yet are written now)."""
        out = {}
        for lk in self.function.lookups:
            schema = schemas[lk.table]
            names: list[str] = []
            for link in chain:
                per_table = self._written.setdefault(id(link), {})
                if lk.table not in per_table:
                    per_table[lk.table] = [self._write_element(lk, schema, e)
                                           for e in link.elements() if e.table == lk.table]
                names += per_table[lk.table]
            folder = self._lookup_folder(lk, schema)
            lineage = f"{self.files.uri(folder)}|{lk.table}"
            uris = [self.files.uri(n) for n in names]
            digest = hashlib.sha256("\n".join(uris).encode()).hexdigest()[:16]
            manifest = f"{folder}/{_safe(lk.table)}@{digest}.manifest"
            if not self.files.exists(manifest):
                self.files.write(manifest, ("\n".join([lineage, *uris]) + "\n").encode())
            out[lk.table] = self.files.uri(manifest)
        return out

    def forget(self, link: ChainLink) -> None:
        """A released link (a rebase, a close) is no longer written."""
        self._written.pop(id(link), None)

    def prune(self) -> None:
        """Remove the state files and manifests no written link names (after a rebase:
        the old chain's; executors holding it read the new base next)."""
        keep = {f for per_table in self._written.values() for fs in per_table.values()
                for f in fs}
        for name in self.files.files(self.folder):
            if name.endswith((".arrow", ".manifest")) and name not in keep:
                self.files.remove(name)

    def close(self) -> None:
        """An ephemeral runtime's files go (its executors' states with them)."""
        self._written.clear()
        if self.ephemeral:
            self.files.remove_folder(self.folder)

    def _function_name(self, spark: SparkSession, value_type: Any) -> str:
        """The session's registered name of the lookup UDF returning ``value_type``."""
        from lakecast.jvm.build import LOOKUP_CLASS

        name = "lakecast_lookup_" + hashlib.sha256(value_type.json().encode()).hexdigest()[:12]
        known = _REGISTERED.setdefault(spark, set())
        if name not in known:
            if not spark.catalog.functionExists(name):  # (registering again warns)
                spark.udf.registerJavaFunction(name, LOOKUP_CLASS, value_type)
            known.add(name)
        return name

    def _stats_name(self, spark: SparkSession) -> str:
        """The session's registered name of the :data:`STATS_CLASS` UDF."""
        from pyspark.sql.types import (
            BooleanType,
            DoubleType,
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        from lakecast.jvm.build import STATS_CLASS

        known = _REGISTERED.setdefault(spark, set())
        if _STATS not in known:
            if not spark.catalog.functionExists(_STATS):
                spark.udf.registerJavaFunction(_STATS, STATS_CLASS, StructType([
                    StructField("executor", StringType()), StructField("jvm", StringType()),
                    StructField("cold", BooleanType()), StructField("build_ms", DoubleType()),
                    StructField("state_bytes", LongType()),
                    StructField("state_rows", LongType()),
                    StructField("evictions", LongType()),
                    StructField("lineages", IntegerType())]))
            known.add(_STATS)
        return _STATS

    def _measured(self, spark: SparkSession, manifests: Mapping[str, str]) -> list[Any]:
        """Per lookup, the aggregate of what each task's JVM holds of its state (one
        ``StateStats`` row per task, as ``__jvm_state<i>``)."""
        from pyspark.sql import functions as F

        name = self._stats_name(spark)
        return [F.collect_list(F.call_function(name, F.lit(bytearray(
            manifests[lk.table].encode())))).alias(f"__jvm_state{i}")
            for i, lk in enumerate(self.function.lookups)]

    def holders(self, seen: Mapping[str, Any], job: TaskMetrics) -> list[TaskMetrics]:
        """One accounting row per executor JVM that held the state in this run: its
        executor and pid, ``cache`` ``"cold"`` where it built a lookup's state from the
        base for this run (``apply_seconds``: the time its files took), the state bytes
        it holds (measured in the JVM, summed over the lookups) and the lineages its LRU
        evicted since the last run this runtime saw of it; the job's counts ride on the
        first row. No JVM reported (no task had a row): the job's row."""
        per_jvm: dict[str, dict[str, Any]] = {}
        for i in range(len(self.function.lookups)):
            for r in seen.get(f"__jvm_state{i}") or []:
                r = r.asDict() if hasattr(r, "asDict") else dict(r)
                h = per_jvm.setdefault(r["jvm"], {"executor": r["executor"], "cold": False,
                                                  "build": 0.0, "bytes": {}, "evictions": 0})
                h["cold"] |= bool(r["cold"])
                h["build"] += float(r["build_ms"]) / 1e3
                h["bytes"][i] = max(h["bytes"].get(i, 0), int(r["state_bytes"]))
                h["evictions"] = max(h["evictions"], int(r["evictions"]))
        if not per_jvm:
            return [job]
        rows = []
        for n, (jvm, h) in enumerate(sorted(per_jvm.items())):
            evicted = h["evictions"] - self._evictions.get(jvm, 0)
            self._evictions[jvm] = h["evictions"]
            pid = jvm.partition("@")[0]
            rows.append(replace(
                job, partition=n, pid=int(pid) if pid.isdigit() else 0,
                cache="cold" if h["cold"] else "warm", state_bytes=sum(h["bytes"].values()),
                apply_seconds=round(h["build"], 4), executor=h["executor"],
                evictions=max(evicted, 0),
                **({} if n == 0 else {"rows_in": 0, "rows_main": 0, "rows_side": {},
                                      "elements_applied": 0})))
        return rows

    def plan(self, spark: SparkSession, chain: Sequence[ChainLink],
             schemas: Mapping[str, pa.Schema], versions: Mapping[str, int],
             events: DataFrame, lineage: bool, function_id: str,
             budget_bytes: int, timezone: str | None = None,
             state_bytes: int = 0, watermark: int | None = None) -> JoinedResult:
        """The run of the lookups over ``events`` at the end of ``chain`` (lazy)."""
        from pyspark.sql import functions as F

        manifests = self.manifests(chain, schemas)
        events_schema = events.schema
        integers = {f.name for f in events_schema.fields
                    if f.dataType.simpleString() in ("tinyint", "smallint", "int", "bigint")}
        calls = []
        for i, lk in enumerate(self.function.lookups):
            schema = schemas[lk.table]
            keys = [F.col(f"`{e}`").cast("bigint") if e in integers else F.col(f"`{e}`")
                    for e, _ in lk.key_pairs]
            calls.append(F.call_function(
                self._function_name(spark, _value_type(schema, lk.column_pairs(schema))),
                F.lit(bytearray(manifests[lk.table].encode())),
                keys[0] if len(keys) == 1 else F.struct(*keys)).alias(f"__lk{i}"))
        return self._plan.run(spark, events_schema, events.select("*", *calls), schemas,
                              versions, lineage, function_id, budget_bytes,
                              timezone=timezone, state_bytes=state_bytes,
                              measured=self._measured(spark, manifests), holders=self.holders,
                              watermark=watermark)

    def warm(self, spark: SparkSession, chain: Sequence[ChainLink],
             schemas: Mapping[str, pa.Schema], tasks: int) -> int:
        """Build the state in the executors of ``tasks`` tasks (a lookup of no key each);
        returns the executor JVMs that built a lookup's state from the base."""
        from pyspark.sql import functions as F

        manifests = self.manifests(chain, schemas)
        cols = []
        for lk in self.function.lookups:
            schema = schemas[lk.table]
            name = self._function_name(spark, _value_type(schema, lk.column_pairs(schema)))
            cols.append(F.call_function(name, F.lit(bytearray(manifests[lk.table].encode())),
                                        F.lit(None).cast("bigint")).isNull())
        (row,) = spark.range(0, tasks, 1, tasks).select(*cols).agg(
            *self._measured(spark, manifests)).collect()
        job = TaskMetrics(partition=0, pid=0, function_id=self.folder, cache=JVM_CACHE,
                          elements_applied=0, rows_applied=0, state_version={},
                          state_bytes=0)
        return sum(m.cache == "cold" for m in self.holders(row.asDict(), job))
