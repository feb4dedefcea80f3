"""The job's small state file next to the MV: phase, creating/created, progress.

It lives in `<target>/_airflow_backfill/state.json` (Delta ignores folders that start
with `_`). The MV's watermark is never stored here: the Delta log's app transaction is
the only source of truth for it. This file only says what the job is doing, for the
CLI, the logs and the Airflow UI; losing it loses no data.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

STATE_DIR = "_airflow_backfill"
STATE_FILE = "state.json"

PHASE_SNAPSHOT = "snapshot"
PHASE_CATCH_UP = "catch_up"
PHASE_FORWARD = "forward"

STATE_CREATING = "creating"
STATE_CREATED = "created"


def state_dir(target: str) -> str:
    return join(target, STATE_DIR)


def read_state(target: str) -> dict[str, Any]:
    """The last recorded state ({} when the job never ran)."""
    text = files.read_text(join(state_dir(target), STATE_FILE))
    return {} if text is None else dict(json.loads(text))


def update_state(target: str, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the state file atomically (no reader sees half of it)."""
    state = read_state(target)
    state.update(fields)
    state["updated_at"] = time.time()
    files.write_text(join(state_dir(target), STATE_FILE), json.dumps(state, indent=2, sort_keys=True))
    return state
