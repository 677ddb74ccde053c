"""Point-in-time replay: committed batches of a pipeline run again into a separate table.

Replay sits below the runtimes in the layers (it builds a fresh runtime like the
pipeline's and runs each batch on it), so :mod:`lakecast.pipeline` knows nothing of it.

- :mod:`~lakecast.replay.batches`  replay batches ``first..last`` at a chosen broadcast
  state (``original``, ``latest`` or a time) and compare with what they wrote
- :mod:`~lakecast.replay.keyed`    a keyed pipeline's replay from its keyed state
"""

from lakecast.replay.batches import (
    LATEST,
    ORIGINAL,
    REPLAY_BATCH,
    ReplayedBatch,
    ReplayError,
    Verdict,
    compare,
    replay,
)
from lakecast.replay.keyed import KeyedReplay

__all__ = ["LATEST", "ORIGINAL", "REPLAY_BATCH", "KeyedReplay", "ReplayError",
           "ReplayedBatch", "Verdict", "compare", "replay"]
