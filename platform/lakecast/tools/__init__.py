"""Command-line tools: the ``lakecast`` command (:mod:`~lakecast.tools.cli`, with
``snapshots`` and ``replay`` subcommands in :mod:`~lakecast.tools.snapshot_cli` and
:mod:`~lakecast.tools.replay_cli`) and the project's pipelines and commands
(:mod:`~lakecast.tools.registry`). Import the modules; nothing is re-exported here."""

__all__ = ["cli", "registry", "replay_cli", "snapshot_cli"]
