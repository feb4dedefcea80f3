"""`verify_primary_key: false`: the engine trusts the upstream's writer to hold each key
once. It then proves nothing before the snapshot and checks no key a round adds; an
upstream that breaks the promise is not refused, and the MV may then differ from its
query. `airflow-backfill verify` (`engine/verify.py`) is what finds such a key, as
docs/jobs.md says; under the default (`true`) the same round is refused before anything
is committed."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from helpers_delta import append_orders
from test_appends import UNFILTERED, snapshotted_mv

from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.verify import verify_mv
from airflow_backfill.exceptions import UpstreamError

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "trusted"])
def test_a_key_written_twice_is_refused_unless_the_writer_is_trusted(spark, tables, verify):
    job, top = snapshotted_mv(spark, tables, rows=40, seed=61, query=UNFILTERED, verify_primary_key=verify)
    held = top - 3  # an order the upstream holds already
    append_orders(job.source, [top + 1, held])

    if verify:
        with pytest.raises(UpstreamError, match=f"order_id={held}"):
            run_catch_up(spark, job)
        assert read_watermark(job.target, job.app_id) == 0
        return
    run_catch_up(spark, job)  # trusted: nothing checks the key, the round commits
    assert read_watermark(job.target, job.app_id) == DeltaTable(job.source).version()
    report = verify_mv(spark, job)
    assert not report.equal, report.lines()
    assert {difference.key["order_id"] for difference in report.differences} == {held}, report.lines()
