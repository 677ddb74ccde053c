"""Command-line tools: the ``lakecast`` command (:mod:`~lakecast.tools.cli`, with
``snapshots`` subcommands in :mod:`~lakecast.tools.snapshot_cli`), the deterministic data
generator (:mod:`~lakecast.tools.datagen`), the live event producer
(:mod:`~lakecast.tools.producer`) and the feature-flag table
(:mod:`~lakecast.tools.flags`). Import the modules; nothing is re-exported here."""

__all__ = ["cli", "datagen", "flags", "producer", "snapshot_cli"]
