"""The broadcast-state API: descriptors, output tags, contexts and the process function.

Close to PyFlink's ``BroadcastProcessFunction``::

    USERS = MapStateDescriptor("users", int, dict)

    class Tagger(BroadcastProcessFunction):
        def state_descriptors(self):
            return [USERS]

        def process_broadcast_element(self, value, ctx):
            ctx.get_broadcast_state(USERS).apply(value, key_columns=["user_id"])

        def process_element(self, value, ctx):
            user = ctx.get_broadcast_state(USERS).get(value["user_id"])
            yield {**value, "segment": user["segment"] if user else "NEW"}

State is declared in ONE hook, :meth:`BroadcastProcessFunction.state_descriptors`.
``process_element`` sees a :class:`ReadOnlyContext` (any write raises
:class:`ReadOnlyStateError`); ``process_broadcast_element`` sees a read-write
:class:`Context`. A function may instead (or also) implement the vectorized
:meth:`BroadcastProcessFunction.process_batch` over Arrow record batches.
Spark-free: the same function runs in :mod:`lakecast.runtime.harness` and :mod:`lakecast.runtime`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from lakecast.api.contracts import TableContract
from lakecast.api.descriptors import HELD, UNMATCHED, MapStateDescriptor, MissingPolicy, OutputTag
from lakecast.api.read_only import ReadOnlyBroadcastState
from lakecast.api.state import BroadcastState

if TYPE_CHECKING:
    import pyarrow as pa

class ReadOnlyContext:
    """What ``process_element`` / ``process_batch`` see: read-only broadcast state."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        """The named state, read-only: every write path raises :class:`ReadOnlyStateError`."""
        raise NotImplementedError

    def timestamp(self) -> int | None:
        """Timestamp (epoch ms) of the element being processed, if known."""
        raise NotImplementedError

    def current_processing_time(self) -> int:
        """Wall-clock time in epoch milliseconds."""
        raise NotImplementedError

    def current_watermark(self) -> int | None:
        """The event-time watermark (epoch ms) given by the caller, ``None`` if none."""
        raise NotImplementedError

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` (a row mapping, or a whole Arrow batch/table) to side output ``tag``."""
        raise NotImplementedError

    def hold(self, value: Any) -> None:
        """Hold ``value`` back: it is returned to the caller to be retried next batch."""
        self.output(HELD, value)

    def state_version(self) -> dict[str, int]:
        """The applied Delta version of every broadcast table ``{table: version}``."""
        raise NotImplementedError

    def state_available(self) -> bool:
        """Whether every broadcast table has delivered at least one version."""
        raise NotImplementedError


class Context(ReadOnlyContext):
    """What ``process_broadcast_element`` sees: read-write broadcast state."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:  # type: ignore[override]
        """The named state, read-write."""
        raise NotImplementedError


class BroadcastProcessFunction:
    """Base class of a broadcast-state function. Override what you need.

    * :meth:`state_descriptors` — the ONE hook declaring the broadcast states.
    * :meth:`process_broadcast_element` — apply one broadcast element (from Delta: a
      :class:`lakecast.api.element.BroadcastElement`) to the state; runs identically on every
      task, so it must be deterministic.
    * :meth:`process_element` — one event (a ``dict``), yields output rows (dicts).
    * :meth:`process_batch` — vectorized alternative: a batch of events
      (``pyarrow.RecordBatch``, or ``pandas.DataFrame`` if ``batch_format = "pandas"``),
      yields output batches. Used instead of ``process_element`` when overridden.
    * :meth:`output_schema` / :meth:`output_tags` — what comes out (needed on Spark).

    ``missing_state`` says what happens to events while some broadcast table has not
    delivered any version yet: ``"default"`` (process anyway; the function falls back to
    its defaults), ``"unmatched"`` (side output :data:`UNMATCHED`) or ``"hold"``
    (returned as held, to retry). Key misses are the function's call: use
    ``ctx.output(UNMATCHED, value)`` or ``ctx.hold(value)``.
    """

    Context: ClassVar[type[Context]] = Context
    ReadOnlyContext: ClassVar[type[ReadOnlyContext]] = ReadOnlyContext

    missing_state: ClassVar[MissingPolicy] = "default"
    batch_format: ClassVar[Literal["arrow", "pandas"]] = "arrow"

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        """Declare the broadcast states this function uses."""
        return ()

    def routing(self) -> tuple[list[str], int] | None:
        """How each batch's events are routed to the tasks of a sharded state (a
        descriptor with ``shards``): the event columns equal to the state's key columns, and
        the shard count; ``None``: no sharded state (the events stay where they are)."""
        return None

    def table_contracts(self) -> Sequence[TableContract]:
        """What each version of a broadcast table must satisfy before it reaches the state
        (key columns, used columns, row checks, policy; :mod:`lakecast.api.contracts`).
        Tables without a contract are applied unchecked."""
        return ()

    def output_tags(self) -> Sequence[OutputTag]:
        """Declare extra side outputs (``UNMATCHED`` and ``HELD`` always exist)."""
        return ()

    def side_output_tags(self) -> list[OutputTag]:
        """All side outputs of this function: ``UNMATCHED``, ``HELD`` and :meth:`output_tags`."""
        tags: list[OutputTag] = [UNMATCHED, HELD]
        for t in self.output_tags():
            if t not in tags:
                tags.append(t)
        return tags

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """Schema of the main output; by default the input schema."""
        return input_schema

    def bind_tables(self, schemas: Mapping[str, pa.Schema]) -> None:
        """Called on the driver, before :meth:`output_schema`, with the Arrow schema of
        each broadcast table (lets a function derive its output types from them)."""

    def open(self) -> None:
        """Called once per task-local instance, before any element."""

    def process_broadcast_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        """Apply one broadcast element to the state (may yield outputs)."""
        return None

    def process_element(self, value: Any, ctx: ReadOnlyContext) -> Iterable[Any] | None:
        """Process one event with read-only state; yield main-output rows."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither process_element nor process_batch"
        )

    def process_batch(self, batch: Any, ctx: ReadOnlyContext) -> Iterable[Any] | Any | None:
        """Vectorized form: process a batch of events with read-only state."""
        raise NotImplementedError

    # -- introspection used by the executor -------------------------------------------
    @classmethod
    def is_vectorized(cls) -> bool:
        """Whether the function overrides :meth:`process_batch`."""
        return cls.process_batch is not BroadcastProcessFunction.process_batch

