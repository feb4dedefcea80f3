"""Table locations: a local path, or `s3://bucket/prefix` (also `s3a://`)."""

from __future__ import annotations

import os
import posixpath

OBJECT_STORE_SCHEMES = ("s3://", "s3a://")


def is_object_store(uri: str) -> bool:
    """True for a table on S3 (or an S3-compatible server), False for a local path."""
    return uri.startswith(OBJECT_STORE_SCHEMES)


def bucket_of(uri: str) -> str:
    """The bucket of an object-store URI."""
    return uri.split("://", 1)[1].split("/", 1)[0]


def object_key(uri: str) -> str:
    """The key of an object-store URI inside its bucket (no leading slash)."""
    rest = uri.split("://", 1)[1]
    return rest.split("/", 1)[1] if "/" in rest else ""


def join(uri: str, *parts: str) -> str:
    """`uri` followed by `parts`, with '/' on object stores and the OS separator locally."""
    if is_object_store(uri):
        return posixpath.join(uri.rstrip("/"), *parts)
    return os.path.join(uri, *parts)


def relative(path: str, base: str) -> str:
    """`path` relative to the table `base` (for messages)."""
    if is_object_store(base):
        return path[len(base.rstrip("/")) + 1:] if path.startswith(base) else path
    return os.path.relpath(path, base)
