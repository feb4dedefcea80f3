"""Small-file operations on local paths and S3 alike (Delta log listings, state files).

Local files keep their atomic write-then-rename; on S3 a PUT is atomic by itself (a
reader sees the old object or the new one, never a part). A failure of the store (nothing
answers, credentials refused) or a local path this process may not use is raised as the
error that names it (`storage/failures.py`), still an `OSError` for callers whose write is
best effort.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from airflow_backfill.storage.failures import names_failures
from airflow_backfill.storage.s3_settings import S3Settings, settings_for
from airflow_backfill.storage.uri import is_object_store

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow.fs import FileSystem


@lru_cache(maxsize=16)
def _s3_filesystem(settings: S3Settings) -> FileSystem:
    from urllib.parse import urlparse

    from pyarrow.fs import S3FileSystem

    options: dict[str, object] = {"region": settings.region or "us-east-1"}
    if settings.endpoint_url:
        parsed = urlparse(settings.endpoint_url)
        options["endpoint_override"] = parsed.netloc
        options["scheme"] = parsed.scheme or "https"
    if settings.access_key_id:
        options.update(access_key=settings.access_key_id, secret_key=settings.secret_access_key,
                       session_token=settings.session_token)
    return S3FileSystem(**options)


def _remote(uri: str) -> tuple[FileSystem, str]:
    settings = settings_for(uri)
    assert settings is not None
    return _s3_filesystem(settings), uri.split("://", 1)[1]


@names_failures("list")
def list_names(directory: str) -> list[str]:
    """Names of the files directly in `directory` ([] when it does not exist)."""
    if not is_object_store(directory):
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []
    from pyarrow.fs import FileSelector

    filesystem, path = _remote(directory)
    infos = filesystem.get_file_info(FileSelector(path.rstrip("/"), allow_not_found=True))
    return [info.base_name for info in infos]


@names_failures("read")
def exists(uri: str) -> bool:
    if not is_object_store(uri):
        return os.path.exists(uri)
    from pyarrow.fs import FileType

    filesystem, path = _remote(uri)
    return filesystem.get_file_info(path).type != FileType.NotFound


@names_failures("read")
def is_directory(uri: str) -> bool:
    """A local directory, or an S3 prefix with at least one object under it (one short
    listing, whatever the number of objects). A local path this process may not look at
    raises AccessDeniedError (`os.path.isdir` would call it absent)."""
    if not is_object_store(uri):
        try:
            return stat.S_ISDIR(os.stat(uri).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
    from pyarrow.fs import FileType

    filesystem, path = _remote(uri)
    return bool(filesystem.get_file_info(path.rstrip("/")).type == FileType.Directory)


def _status(uri: str) -> tuple[int | None, int, int] | None:
    """The file's inode (None on an object store), size and last modification (ns); None
    when there is no such file."""
    if not is_object_store(uri):
        try:
            stat = os.stat(uri)
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns
    from pyarrow.fs import FileType

    filesystem, path = _remote(uri)
    info = filesystem.get_file_info(path)
    if info.type == FileType.NotFound:
        return None
    return None, info.size or 0, info.mtime_ns or 0


@names_failures("read")
def identity(uri: str) -> tuple[int, ...] | None:
    """What tells a file apart from another one written later at the same path."""
    status = _status(uri)
    if status is None:
        return None
    inode, size, modified_ns = status
    return (size, modified_ns) if inode is None else (inode, size, modified_ns)


@names_failures("read")
def size_and_modified_ms(uri: str) -> tuple[int, int] | None:
    """The file's size and last modification (milliseconds, as Hadoop's file statuses give
    it); None when there is no such file."""
    status = _status(uri.removeprefix("file://"))
    return None if status is None else (status[1], status[2] // 1_000_000)


@names_failures("read")
def size(uri: str) -> int:
    if not is_object_store(uri):
        return os.path.getsize(uri.removeprefix("file://"))
    filesystem, path = _remote(uri)
    return int(filesystem.get_file_info(path).size or 0)


@names_failures("read")
def read_parquet_columns(uri: str, columns: list[str]) -> pa.Table:
    """`columns` of one Parquet data file, read on the driver (a few small files' keys)."""
    import pyarrow.parquet as pq

    if not is_object_store(uri):
        return pq.read_table(uri.removeprefix("file://"), columns=columns)
    filesystem, path = _remote(uri)
    return pq.read_table(path, columns=columns, filesystem=filesystem)


def parquet_batches(uri: str, columns: list[str], batch_rows: int, *,
                    dictionary: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    """`columns` of one Parquet file, `batch_rows` rows at a time (`dictionary`: columns read
    dictionary-encoded), so the driver holds one batch of a large file at once."""
    # buffered: no whole column chunk held
    with parquet_file(uri, read_dictionary=list(dictionary), buffer_size=1 << 20) as parquet:
        yield from parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False)


@names_failures("read")
def parquet_file(uri: str, **options: Any) -> pq.ParquetFile:
    """One Parquet file opened for reading its row groups or batches (`options`: those of
    `pyarrow.parquet.ParquetFile`); use it as a context manager."""
    import pyarrow.parquet as pq

    if not is_object_store(uri):
        return pq.ParquetFile(uri.removeprefix("file://"), **options)
    filesystem, path = _remote(uri)
    return pq.ParquetFile(filesystem.open_input_file(path), **options)


@names_failures("read")
def parquet_metadata(uri: str) -> pq.FileMetaData:
    """One Parquet file's footer (its row count and schema), without its data."""
    import pyarrow.parquet as pq

    if not is_object_store(uri):
        return pq.read_metadata(uri.removeprefix("file://"))
    filesystem, path = _remote(uri)
    with filesystem.open_input_file(path) as source:
        return pq.read_metadata(source)


@names_failures("read")
def read_bytes(uri: str, offset: int = 0, length: int | None = None) -> bytes:
    """`length` bytes of the file from `offset` (to its end when None): a deletion vector
    is a few bytes at an offset of a larger file."""
    if not is_object_store(uri):
        with open(uri.removeprefix("file://"), "rb") as handle:
            handle.seek(offset)
            return handle.read() if length is None else handle.read(length)
    filesystem, path = _remote(uri)
    with filesystem.open_input_file(path) as source:
        if length is None:
            length = source.size() - offset
        return bytes(source.read_at(length, offset))


@names_failures("read")
def read_text(uri: str) -> str | None:
    """The file's text, None when it does not exist."""
    if not is_object_store(uri):
        try:
            with open(uri) as handle:
                return handle.read()
        except FileNotFoundError:
            return None
    filesystem, path = _remote(uri)
    try:
        with filesystem.open_input_stream(path) as stream:
            return stream.read().decode()
    except FileNotFoundError:
        return None


@names_failures("write")
def write_text(uri: str, text: str, *, durable: bool = False) -> None:
    """Replace the file's content in one step: no reader ever sees a part of it.

    `durable`: locally, fsync before the rename (progress that must survive a crash of
    the machine, not only of the process).
    """
    if is_object_store(uri):
        write_bytes(uri, text.encode())
        return
    directory, name = os.path.split(uri)
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{name}-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp_path, uri)


@names_failures("write")
def write_bytes(uri: str, content: bytes) -> None:
    """Write a new file whole (a data file no reader knows of until a commit names it)."""
    if is_object_store(uri):
        filesystem, path = _remote(uri)
        with filesystem.open_output_stream(path) as stream:
            stream.write(content)
        return
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    with open(uri, "wb") as handle:
        handle.write(content)


@names_failures("delete")
def remove(uri: str) -> None:
    """Delete the file if it exists."""
    if not is_object_store(uri):
        try:
            os.remove(uri)
        except FileNotFoundError:
            pass
        return
    filesystem, path = _remote(uri)
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass


@names_failures("delete")
def delete(uri: str) -> bool:
    """Delete a file or a whole folder (prefix); False when nothing was there."""
    if not is_object_store(uri):
        if os.path.isdir(uri):
            shutil.rmtree(uri)
            return True
        if os.path.exists(uri):
            os.remove(uri)
            return True
        return False
    from pyarrow.fs import FileType

    filesystem, path = _remote(uri)
    kind = filesystem.get_file_info(path).type
    if kind == FileType.File:
        filesystem.delete_file(path)
        return True
    if is_directory(uri):
        filesystem.delete_dir(path)
        return True
    return False
