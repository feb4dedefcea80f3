"""Whether an old version of a Delta table can still be read whole: its data files and its
deletion vectors.

VACUUM deletes the files the latest version no longer references once they are older
than the retention: time travel to an older version then finds its log entry but fails
on a missing file, mid-read. Checked before a version is read (a snapshot's pinned
epoch, a read across MVs), so nothing is read, or written, from a version that is only
partly there. Shared by the snapshot phases and the consistent reads, one floor below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.log import delta_table, load_table
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.storage import files

if TYPE_CHECKING:
    from deltalake import DeltaTable

SHOWN_FILES = 3
FILE_RETENTION = "delta.deletedFileRetentionDuration"


@dataclass(frozen=True)
class Vacuumed:
    """What of a version is gone."""

    what: str

    def describe(self, uri: str, version: int) -> str:
        return f"version {version} of {uri} was vacuumed: {self.what}"


def vacuumed(uri: str, version: int, table: DeltaTable | None = None) -> Vacuumed | None:
    """What VACUUM removed of `version` of the table at `uri` (`table`: delta-rs' view of
    that version, when the caller holds it), or None when it can be read whole. Only files
    the latest version no longer references are looked for, so checking a recent version
    costs a listing, not a read."""
    latest = load_table(uri)
    if version == latest.version():
        return None
    table = table or delta_table(uri, version)
    gone = sorted(path for path in set(table.file_uris()) - set(latest.file_uris()) if not files.exists(path))
    if gone:
        more = f" and {len(gone) - SHOWN_FILES} more" if len(gone) > SHOWN_FILES else ""
        return Vacuumed(f"{len(gone)} of its data files are gone ({', '.join(gone[:SHOWN_FILES])}{more})")
    if "deletionVectors" in (table.protocol().reader_features or []):
        try:
            table.deletion_vectors()  # reads every vector the version references
        except Exception as error:  # noqa: BLE001 - a vector file that VACUUM deleted
            return Vacuumed(f"its deletion vectors cannot be read ({error})")
    return None


def check_not_vacuumed(uri: str, version: int) -> None:
    """Refuse to read `version` of the upstream at `uri` once VACUUM removed part of it, with
    what to do, before anything is read or written (an `UpstreamError`)."""
    gone = vacuumed(uri, version)
    if gone is not None:
        raise UpstreamError(
            f"upstream {gone.describe(uri, version)}. Pin a newer epoch (rerun pin_epoch), or vacuum the "
            f"upstream with a longer retention ({FILE_RETENTION})."
        )
