"""Whether an old version of a Delta table can still be read: its log entry, its data files
and its deletion vectors.

VACUUM deletes the files the latest version no longer references once they are older
than the retention, and log cleanup drops old log entries: either makes time travel to
the version fail. Checked before an answer is given, so nothing is read from a version
that is only partly there.
"""

from __future__ import annotations

from airflow_backfill.engine.delta.log import delta_table, load_table
from airflow_backfill.exceptions import ConsistencyError
from airflow_backfill.storage import files

SHOWN_FILES = 3


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
    latest = load_table(uri)
    if version == latest.version():
        return
    gone = sorted(path for path in set(table.file_uris()) - set(latest.file_uris()) if not files.exists(path))
    if gone:
        shown = ", ".join(gone[:SHOWN_FILES]) + (f" and {len(gone) - SHOWN_FILES} more" if len(gone) > SHOWN_FILES
                                                  else "")
        raise ConsistencyError(
            f"{name}: version {version} of {uri} was vacuumed: {len(gone)} of its data files are gone ({shown}). "
            "Read a newer epoch, or vacuum with a longer retention (delta.deletedFileRetentionDuration)."
        )
    if "deletionVectors" in (table.protocol().reader_features or []):
        try:
            table.deletion_vectors()  # reads every vector the version references
        except Exception as error:  # noqa: BLE001 - a vector file that VACUUM deleted
            raise ConsistencyError(
                f"{name}: version {version} of {uri} was vacuumed: its deletion vectors cannot be read ({error}). "
                "Read a newer epoch, or vacuum with a longer retention (delta.deletedFileRetentionDuration)."
            ) from None
