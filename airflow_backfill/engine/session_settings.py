"""Spark session settings changed for a block of code only.

Why: some writes and commands read a setting from the session when they run (Parquet's
row-group bound, OPTIMIZE's file size), with no per-call option; set for the whole
session, it would reach every later write too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def session_settings(spark: SparkSession, values: Mapping[str, str]) -> Iterator[None]:
    """The session with `values` set for the block, each setting then back as it was."""
    previous = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, before in previous.items():
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)
