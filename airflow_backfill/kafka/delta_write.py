"""One Delta append through delta-spark, idempotent by app transaction, with its facts in userMetadata."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.commits import append
from airflow_backfill.engine.delta.log import METADATA_PREFIX, table_exists

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def append_commit(df: DataFrame, uri: str, app_id: str, txn_version: int, metadata: dict[str, Any]) -> None:
    """Append `df` to the Delta table at `uri` (created if absent) in one commit.

    The app transaction (`txnAppId`/`txnVersion`) makes a replayed round a no-op; the
    metadata (offsets, split states) travels in the same commit as the rows it describes.
    A new table gets the change feed on, as every table the engine creates: another job's
    MV (a join among them) can then follow it.
    """
    user_metadata = json.dumps({f"{METADATA_PREFIX}{key}": value for key, value in metadata.items()}, sort_keys=True)
    append(df, uri, app_id=app_id, version=txn_version, user_metadata=user_metadata, create=not table_exists(uri))
