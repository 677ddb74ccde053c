"""A batch's Spark job failures that have a known cause, translated: one line naming the
table, the version and what the user does; the Spark stage trace stays in the Spark log
(``var/log/spark.log``), off the error (it is raised ``from None``).

- a JVM lookup state file or manifest (:mod:`lakecast.runtime.jvm_state`) missing or
  unreadable when a task needed it: :class:`StateFileError`;
- a conflicting concurrent commit to an output table on Spark's Delta write path
  (``ConcurrentAppendException``, ``ConcurrentTransactionException``...; the ``deltalake``
  path: :func:`lakecast.delta.arrow_write.write_failure`): :class:`ConcurrentCommitError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from lakecast.errors import LakecastError

#: what ``StateLookup`` (the JVM lookup) says of a state file it cannot use
_STATE = re.compile(r"Lakecast JVM lookup state (file|manifest) (\S+) is "
                    r"(missing|unreadable)(?: \(([^()]*(?:\([^()]*\))?[^()]*)\))?")
_FILE = re.compile(r"(?P<table>[^/]+)-v(?P<version>\d+)(-t\d+)?\.(full|changes)\.arrow$")
_MANIFEST = re.compile(r"(?P<table>[^/]+)@[0-9a-f]+\.manifest$")
#: Delta Spark's conflicts a commit cannot reconcile (its own retries gave up)
_CONFLICT = re.compile(r"(Concurrent(Append|DeleteRead|DeleteDelete|Transaction)Exception|"
                       r"MetadataChangedException|ProtocolChangedException|"
                       r"DELTA_CONCURRENT_[A-Z_]+|DELTA_METADATA_CHANGED|"
                       r"DELTA_PROTOCOL_CHANGED)")


class StateFileError(LakecastError):
    """A JVM lookup state file was missing or unreadable when a task needed it."""


class ConcurrentCommitError(LakecastError):
    """Another writer committed to an output table at the same time, in conflict."""


def _log_file() -> str:
    from lakecast.config import get_settings

    return str(get_settings().var_dir / "log" / "spark.log")


def state_file_failure(exc: BaseException, versions: Mapping[str, int],
                       pipeline: str) -> StateFileError | None:
    """``exc`` as a :class:`StateFileError` when a JVM lookup state file caused it
    (``versions``: the batch's broadcast versions), else ``None``."""
    m = _STATE.search(str(exc))
    if m is None:
        return None
    what, path, state, why = m.groups()
    name = path.rsplit("/", 1)[-1]
    found = (_FILE if what == "file" else _MANIFEST).search(name)
    table = found.group("table") if found else "a lookup table"
    version = versions.get(table)
    at = f"state version {version}" if version is not None else "its state"
    if state == "missing":
        cause = "was missing when a task needed it (its runtime was closed or rebased, or "
        cause += "the JVM state root was cleaned while the batch ran, or the executor "
        cause += "cannot see it)"
        fix = ("run the pipeline again: the batch is redone exactly once and its runtime "
               "writes the state files again; stop whatever cleans the state root "
               "(LAKECAST_JVM_STATE_ROOT, default <checkpoint root>/_jvm-state) during runs, "
               "and put it on storage every executor reads (or declare jvm_lookups=False to "
               "hold the state in the Python workers)")
    else:
        cause = f"could not be read ({why or 'damaged'})"
        fix = (f"remove {path.rsplit('/', 2)[0]} (the runtime writes it again) and run the "
               "pipeline again: the batch is redone exactly once (or declare "
               "jvm_lookups=False to hold the state in the Python workers)")
    return StateFileError(
        f"{pipeline}: the JVM lookup state of {table} ({at}, {what} {path}) {cause}; "
        f"nothing of the batch was committed. Fix: {fix}. Full trace: {_log_file()}")


def concurrent_commit_failure(exc: BaseException, pipeline: str,
                              batch_id: int) -> ConcurrentCommitError | None:
    """``exc`` as a :class:`ConcurrentCommitError` when a conflicting concurrent Delta
    commit (Spark's write path) caused it, else ``None``."""
    m = _CONFLICT.search(str(exc))
    if m is None:
        return None
    return ConcurrentCommitError(
        f"{pipeline}: batch {batch_id}'s write to an output table conflicted with a commit "
        f"another writer made at the same time ({m.group(1)}); Delta retried the commit and "
        f"could not reconcile it, so that write committed nothing. Fix: make sure one job "
        f"writes the pipeline's tables at a time (not two launches, nor the sensor's run and "
        f"the continuous run), then run the pipeline again: the batch is redone exactly once "
        f"(its transaction ids skip what was committed). Full trace: {_log_file()}")


def translated(exc: BaseException, pipeline: str, batch_id: int,
               versions: Mapping[str, int]) -> LakecastError | None:
    """``exc`` (a failure of batch ``batch_id``) translated by its cause, or ``None``."""
    if isinstance(exc, LakecastError):
        return None
    return (state_file_failure(exc, versions, pipeline)
            or concurrent_commit_failure(exc, pipeline, batch_id))
