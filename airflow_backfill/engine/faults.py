"""Test-only fault injection: kill the current process at a named point of a phase.

Set `AIRFLOW_BACKFILL_FAULT` to `<phase>:<point>` (several separated by commas), e.g.
`snapshot:after_chunks=2`, `snapshot:after_write`, `catch_up:after_write`,
`forward:after_commit`. Points:

- `after_chunks=N`: the snapshot recorded N chunks as done.
- `after_write`: the commit's files are written, the commit not made (`delta/commit_fence`);
  for a MERGE or DELETE, which Delta writes and commits in one call, just before that call.
- `after_state_commit` (aggregates): the hidden per-group state is committed, the MV
  not yet; the rerun brings the MV to the state's epoch first.
- `after_commit`: the Delta commit is made, the phase's own bookkeeping not yet.

The process ends with SIGKILL, like an out-of-memory kill or a lost worker: no cleanup
code runs. Delta commits themselves are atomic (one log file created with
put-if-absent), so a kill inside one leaves either the whole commit or none of it.
"""

from __future__ import annotations

import logging
import os
import signal

ENV_VARIABLE = "AIRFLOW_BACKFILL_FAULT"

log = logging.getLogger(__name__)


def _armed() -> set[str]:
    return {item.strip() for item in os.environ.get(ENV_VARIABLE, "").split(",") if item.strip()}


def maybe_crash(phase: str, point: str) -> None:
    """SIGKILL this process if `<phase>:<point>` is armed."""
    if f"{phase}:{point}" in _armed():
        log.warning("fault injection: killing the %s phase at %s", phase, point)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
