"""Whether an old version of a Delta table can still be read: its log entry, its data files
and its deletion vectors (`delta/vacuumed.py`).

VACUUM deletes the files the latest version no longer references once they are older
than the retention, and log cleanup drops old log entries: either makes time travel to
the version fail. Checked before an answer is given, so nothing is read from a version
that is only partly there.
"""

from __future__ import annotations

from airflow_backfill.engine.delta.log import delta_table
from airflow_backfill.engine.delta.vacuumed import FILE_RETENTION, vacuumed
from airflow_backfill.exceptions import ConsistencyError


def check_readable(name: str, uri: str, version: int) -> None:
    """Raise ConsistencyError, naming the table and the version, unless `version` of the
    table at `uri` can be read whole."""
    try:
        table = delta_table(uri, version)
    except Exception as error:  # noqa: BLE001 - delta-rs raises generic errors for a missing version
        raise ConsistencyError(
            f"{name}: version {version} of {uri} can no longer be read ({error}): its log entries were "
            "cleaned up (delta.logRetentionDuration). Read a newer epoch, or keep the log longer."
        ) from None
    gone = vacuumed(uri, version, table)
    if gone is not None:
        raise ConsistencyError(
            f"{name}: {gone.describe(uri, version)}. Read a newer epoch, or vacuum with a longer retention "
            f"({FILE_RETENTION})."
        )
