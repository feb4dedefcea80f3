"""Values compared as an MV row must keep them: a float by its bits (-0.0 apart from 0.0,
which Python's == equates), every NaN as one value (which == never equates)."""

from __future__ import annotations

import struct
from typing import Any


def exact_value(value: Any) -> Any:
    if isinstance(value, float):
        return "NaN" if value != value else struct.pack(">d", value).hex()
    return value


def exact_rows(frame: Any) -> list[tuple[Any, ...]]:
    """A Spark frame's rows, collected, with `exact_value`s, sorted."""
    return sorted((tuple(exact_value(v) for v in row) for row in frame.collect()), key=repr)


def float_bits(value: float) -> str:
    return struct.pack(">d", value).hex()
