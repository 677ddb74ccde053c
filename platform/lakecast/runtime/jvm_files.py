"""Where the JVM lookups' state chain lives: files under one root every executor reads.

The driver writes (pyarrow's filesystems: the local one, or S3 with the lake's options,
:func:`lakecast.delta.objstore.filesystem`); the executors read the same files by URI
through Hadoop's ``FileSystem`` with the cluster's credentials (``StateLookup.java``).
The root is :attr:`lakecast.config.Settings.jvm_state_dir`: ``LAKECAST_JVM_STATE_ROOT``,
else ``<checkpoint root>/_jvm-state`` — a local folder for a local or loopback deployment,
``s3a://...`` when the checkpoints are on object storage.

A file is written once, whole: locally to a partial name then renamed, on S3 by one PUT
(never visible half-written either way). Names are relative to the root (``a/b.arrow``);
:meth:`StateFiles.uri` is what a manifest names.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakecast.delta import objstore

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

    from lakecast.config import Settings


@dataclass
class StateFiles:
    """The files under one state root (a local path or an ``s3a://`` / ``s3://`` URI)."""

    root: str
    fs: pafs.FileSystem
    #: the root's path in :attr:`fs`
    base: str
    #: the root as executors read it (``file:/...`` or the object store's URI)
    root_uri: str

    @classmethod
    def at(cls, root: str, settings: Settings | None = None) -> StateFiles:
        import pyarrow.fs as pafs

        if objstore.is_object_store(root):
            fs, base = objstore.filesystem(root, settings)
            return cls(root, fs, base, root.rstrip("/"))
        path = Path(root.removeprefix("file://").removeprefix("file:")).resolve()
        return cls(root, pafs.LocalFileSystem(), str(path), f"file://{path}")

    @property
    def local(self) -> bool:
        return self.root_uri.startswith("file:")

    def _path(self, name: str) -> str:
        return f"{self.base}/{name}" if name else self.base

    def uri(self, name: str) -> str:
        """``name`` as a manifest names it (what Hadoop's FileSystem opens)."""
        return f"{self.root_uri}/{name}"

    def exists(self, name: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self._path(name)).type != pafs.FileType.NotFound

    def write(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` whole (see the module doc)."""
        path = self._path(name)
        if self.local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            partial = f"{Path(path).parent}/.{Path(path).name}.{os.getpid()}.partial"
            with self.fs.open_output_stream(partial) as out:
                out.write(data)
            self.fs.move(partial, path)
            return
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def write_arrow(self, name: str, table: pa.Table, chunk_rows: int = 64_000) -> None:
        """``table`` as an Arrow IPC file at ``name``."""
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=chunk_rows)
        self.write(name, sink.getvalue().to_pybytes())

    def files(self, folder: str = "") -> list[str]:
        """The names of every file under ``folder`` (recursively)."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self._path(folder), recursive=True,
                                                        allow_not_found=True))
        return [i.path[len(self.base) + 1:] for i in infos if i.type == pafs.FileType.File]

    def folders(self) -> list[tuple[str, float]]:
        """``(name, newest file's mtime or now)`` of each folder directly under the root."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        out = []
        for i in infos:
            if i.type != pafs.FileType.Directory:
                continue
            mtime = i.mtime.timestamp() if i.mtime is not None else None
            if mtime is None:  # an object store's prefix: its newest file says
                inner = self.fs.get_file_info(pafs.FileSelector(i.path, recursive=True))
                times = [f.mtime.timestamp() for f in inner if f.mtime is not None]
                mtime = max(times, default=time.time())
            out.append((i.base_name, mtime))
        return out

    def remove(self, name: str) -> None:
        """Remove the file ``name`` (nothing if absent)."""
        with contextlib.suppress(OSError):
            self.fs.delete_file(self._path(name))

    def remove_folder(self, name: str) -> None:
        """Remove the folder ``name`` and everything in it (nothing if absent)."""
        with contextlib.suppress(OSError):
            self.fs.delete_dir(self._path(name))
