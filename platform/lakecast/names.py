"""Names that become paths and Dagster names, checked where they enter (a ``defs.yaml``,
a ``PipelineDeclaration``, the engine's builders): a pipeline's name is a folder under the
checkpoint root and a prefix of Dagster job names; a table's name is a folder under the
lake root. A name that could leave its folder (``..``, ``/``) never reaches a path."""

from __future__ import annotations

import re

from lakecast.errors import ConfigError

__all__ = ["check_pipeline_folder", "check_pipeline_name", "check_table_name"]

#: a pipeline's name: what Dagster allows in a job name (letters, digits, _)
PIPELINE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a table's name: one folder under the lake root
TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def check_pipeline_name(value: object, field: str = "name") -> str:
    """``value`` if it is a valid pipeline name, else a :class:`ConfigError` naming the
    field and the allowed form."""
    if not isinstance(value, str) or not PIPELINE_NAME.fullmatch(value):
        raise ConfigError(f"field {field!r} = {value!r} is not a valid pipeline name: use "
                          "letters, digits and _, starting with a letter or _ (it names a "
                          "folder under the checkpoint root and the pipeline's Dagster jobs)")
    return value


def check_table_name(value: object, field: str = "table") -> str:
    """``value`` if it is a valid table name, else a :class:`ConfigError` naming the field
    and the allowed form."""
    if not isinstance(value, str) or not TABLE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"field {field!r} = {value!r} is not a valid table name: use "
                          "letters, digits, _, - and . (no '..', no '/'): it names one "
                          "folder under the lake root")
    return value


def check_pipeline_folder(value: object, field: str = "pipeline") -> str:
    """``value`` if it can name a pipeline's folder under the checkpoint root (the engine's
    pipeline names may also hold ``-`` and ``.``), else a :class:`ConfigError`."""
    if not isinstance(value, str) or not TABLE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"field {field!r} = {value!r} cannot name a pipeline's folder: "
                          "use letters, digits, _, - and . (no '..', no '/')")
    return value
