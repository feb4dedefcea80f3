"""Delta deletion vectors read and written by the driver, as the protocol stores them.

Why: a round that changes a few rows of a large MV marks those rows deleted in the files
that hold them and appends their new rows; Delta's own DELETE finds and marks them with
Spark jobs (about a second), where the driver knows the rows already and writes the
vectors in milliseconds. Upstreams written by Spark carry vectors too, and reading which
of their rows are live must not need a Spark job either.

The format (Delta protocol, "Deletion Vector Format"): a vector is a 64-bit roaring
bitmap of row positions in its data file, serialized in the portable format behind the
magic number 1681511377 (little-endian). It is stored inline in the log (`i`, Z85 text),
or in a file (`u`: a UUID, Z85-encoded after an optional random prefix, naming
`<table>/<prefix>/deletion_vector_<uuid>.bin`; `p`: an absolute path). A file starts with
a version byte (1); each vector in it is its size (4 bytes, big-endian), the bitmap, and
the CRC-32 of the bitmap (4 bytes, big-endian); a descriptor's `offset` points at the
size. pyroaring's `BitMap64.serialize` writes the portable format byte for byte as Delta's
`RoaringBitmapArray` does (`tests/test_deletion_vectors.py` reads Spark's vectors and
has Spark read these).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import numpy as np

from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

MAGIC = 1681511377
FORMAT_VERSION = 1
Z85_CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUES = {character: value for value, character in enumerate(Z85_CHARACTERS)}
_UUID_CHARACTERS = 20
"""A UUID's 16 bytes in Z85."""


class DeletionVectorError(ValueError):
    """A vector that does not read back as the protocol describes (damaged or unknown)."""


def z85_encode(data: bytes) -> str:
    """Z85 text of `data`, whose length must be a multiple of 4."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out: list[str] = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], "big")
        word = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            word.append(Z85_CHARACTERS[digit])
        out.extend(reversed(word))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 `text` (a multiple of 5 characters)."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text of {len(text)} characters is not whole words")
    out = bytearray()
    for start in range(0, len(text), 5):
        value = 0
        for character in text[start:start + 5]:
            try:
                value = value * 85 + _Z85_VALUES[character]
            except KeyError:
                raise DeletionVectorError(f"{character!r} is not a Z85 character") from None
        out += value.to_bytes(4, "big")
    return bytes(out)


def vector_path(table_uri: str, descriptor: Mapping[str, Any]) -> str:
    """The file a stored (`u` or `p`) vector is in."""
    kind, text = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "p":
        return unquote(text)
    if kind != "u":
        raise DeletionVectorError(f"a vector stored as {kind!r} is not in a file")
    prefix, encoded = text[:-_UUID_CHARACTERS], text[-_UUID_CHARACTERS:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return join(table_uri, prefix, name) if prefix else join(table_uri, name)


def deleted_rows(table_uri: str, descriptor: Mapping[str, Any] | None) -> np.ndarray:
    """The row positions a file's vector marks deleted, sorted (none without a vector)."""
    if not descriptor:
        return np.zeros(0, np.uint64)
    return _deleted_rows(table_uri, _key(descriptor))


def unique_id(descriptor: Mapping[str, Any] | None) -> str:
    """The protocol's identifier of a vector (with its file's path, it names a live file)."""
    if not descriptor:
        return ""
    offset = descriptor.get("offset")
    text = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    return text if offset is None else f"{text}@{offset}"


def _key(descriptor: Mapping[str, Any]) -> tuple[str, str, int | None, int, int]:
    return (str(descriptor["storageType"]), str(descriptor["pathOrInlineDv"]), descriptor.get("offset"),
            int(descriptor["sizeInBytes"]), int(descriptor["cardinality"]))


@lru_cache(maxsize=4096)
def _deleted_rows(table_uri: str, key: tuple[str, str, int | None, int, int]) -> np.ndarray:
    """A vector's positions; kept per descriptor (a vector never changes once written)."""
    from pyroaring import BitMap64

    kind, text, offset, size, cardinality = key
    if kind == "i":
        data = z85_decode(text)[:size]
    else:
        start = offset or 0
        stored = files.read_bytes(vector_path(table_uri, {"storageType": kind, "pathOrInlineDv": text}),
                                  start, size + 8)
        (length,) = struct.unpack(">i", stored[:4])
        data = stored[4:4 + length]
        (checksum,) = struct.unpack(">I", stored[4 + length:8 + length])
        if length != size or zlib.crc32(data) != checksum:
            raise DeletionVectorError(f"the deletion vector at {text}@{offset} of {table_uri} is damaged")
    (magic,) = struct.unpack("<i", data[:4])
    if magic != MAGIC:
        raise DeletionVectorError(f"the deletion vector {text} of {table_uri} has an unknown format ({magic})")
    positions = np.array(BitMap64.deserialize(data[4:]).to_array(), dtype=np.uint64)
    if len(positions) != cardinality:
        raise DeletionVectorError(f"the deletion vector {text} of {table_uri} holds {len(positions)} rows, "
                                  f"its descriptor says {cardinality}")
    positions.setflags(write=False)
    return positions


def write_vectors(table_uri: str, vectors: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """Write `vectors` (each a file's deleted row positions) into one new vector file of the
    table; their descriptors, in order. Nothing names the file until a commit does."""
    from pyroaring import BitMap64

    identifier = uuid.uuid4()
    content = bytearray([FORMAT_VERSION])
    descriptors = []
    for positions in vectors:
        bitmap = struct.pack("<i", MAGIC) + BitMap64(np.asarray(positions, dtype=np.uint64)).serialize()
        descriptors.append({"storageType": "u", "pathOrInlineDv": z85_encode(identifier.bytes),
                            "offset": len(content), "sizeInBytes": len(bitmap), "cardinality": len(positions)})
        content += struct.pack(">i", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))
    if descriptors:
        files.write_bytes(join(table_uri, f"deletion_vector_{identifier}.bin"), bytes(content))
    return descriptors
