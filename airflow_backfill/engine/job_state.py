"""The job's small state file next to the MV: phase, creating/created, progress.

It lives in `<target>/_airflow_backfill/state.json` (Delta ignores folders that start
with `_`). The MV's watermark is never stored here: the Delta log's app transaction is
the only source of truth for it. This file only says what the job is doing, for the
CLI, the logs and the Airflow UI; losing it loses no data.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

STATE_DIR = "_airflow_backfill"
STATE_FILE = "state.json"

PHASE_SNAPSHOT = "snapshot"
PHASE_CATCH_UP = "catch_up"
PHASE_FORWARD = "forward"

STATE_CREATING = "creating"
STATE_CREATED = "created"


def state_dir(target: str) -> str:
    return os.path.join(target, STATE_DIR)


def read_state(target: str) -> dict[str, Any]:
    """The last recorded state ({} when the job never ran)."""
    try:
        with open(os.path.join(state_dir(target), STATE_FILE)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def update_state(target: str, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the state file atomically (write then rename)."""
    state = read_state(target)
    state.update(fields)
    state["updated_at"] = time.time()
    directory = state_dir(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".state-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
    os.replace(tmp_path, os.path.join(directory, STATE_FILE))
    return state
