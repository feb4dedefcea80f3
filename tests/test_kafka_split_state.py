"""The split state machine and round planning, without Kafka or Spark."""

from __future__ import annotations

import pytest

from airflow_backfill.exceptions import BackfillConfigError, UnsupportedQueryError, UpstreamError
from airflow_backfill.kafka import split_state
from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaTopic
from airflow_backfill.kafka.offsets import PartitionRange
from airflow_backfill.kafka.positions import BackfillPosition, SourcePosition
from airflow_backfill.kafka.source_backfill import commit_metadata_for, plan_round
from airflow_backfill.kafka.split_state import BACKFILLING, FINISHED, SOURCE_CACHING_UP, SplitState

TOPIC = KafkaTopic("127.0.0.1:9092", "orders", "id BIGINT, amount DOUBLE")


def _job(tmp_path, **overrides):
    fields = dict(name="mv", upstream=TOPIC, source_table=str(tmp_path / "src"), query="SELECT id FROM source",
                  target=str(tmp_path / "mv"))
    fields.update(overrides)
    return KafkaBackfillJob(**fields)


@pytest.mark.parametrize(
    ("offset", "committed", "kind"),
    [(5, 9, BACKFILLING), (9, 9, FINISHED), (12, 9, SOURCE_CACHING_UP), (-1, -1, FINISHED)],
)
def test_after_backfill_read(offset, committed, kind):
    assert split_state.after_backfill_read(offset, committed) == SplitState(kind, offset)


def test_source_caching_up_waits_for_the_committed_offset():
    waiting = SplitState(SOURCE_CACHING_UP, 12)
    assert split_state.after_source_commit(waiting, 11) == waiting
    assert split_state.after_source_commit(waiting, 12) == SplitState(FINISHED, 12)
    assert split_state.after_source_commit(SplitState(BACKFILLING, 3), 50) == SplitState(BACKFILLING, 3)


def test_states_round_trip_through_json():
    states = {0: SplitState(FINISHED, 4), 3: SplitState(SOURCE_CACHING_UP, 9), 1: split_state.backfilling()}
    assert split_state.states_from_json(split_state.states_to_json(states)) == states
    assert str(split_state.backfilling()) == "Backfilling(None)"
    with pytest.raises(ValueError, match="unknown split state"):
        SplitState("Done", 1)


def test_plan_moves_every_split_one_step(tmp_path):
    position = BackfillPosition(splits={
        0: SplitState(BACKFILLING, 9),        # reads (9, 9+budget] from Kafka
        1: SplitState(SOURCE_CACHING_UP, 30),  # source committed 35 -> Finished, takes (30, 35] from the source
        2: SplitState(FINISHED, 7),            # follows the source: (7, 20]
    }, round=4)
    source = SourcePosition(version=11, offsets={0: 100, 1: 35, 2: 20, 3: 2})
    ranges = {p: PartitionRange(0, 200) for p in range(4)}  # partition 3 was added mid-backfill
    plan = plan_round(_job(tmp_path), position, source, ranges, budget=50)
    assert plan.kafka_reads == {0: (10, 60), 3: (0, 50)}
    assert plan.source_reads == {1: (30, 35), 2: (7, 20)}
    assert plan.splits == {
        0: SplitState(BACKFILLING, 59), 1: SplitState(FINISHED, 35),
        2: SplitState(FINISHED, 20), 3: SplitState(SOURCE_CACHING_UP, 49),
    }
    metadata = commit_metadata_for(plan, 5)
    assert metadata["watermark"] is None and metadata["kafka_round"] == 5 and metadata["source_version"] == 11


def test_plan_with_every_split_finished_sets_the_watermark(tmp_path):
    position = BackfillPosition(splits={0: SplitState(FINISHED, 3)})
    source = SourcePosition(version=8, offsets={0: 6})
    plan = plan_round(_job(tmp_path), position, source, {0: PartitionRange(0, 7)}, budget=10)
    assert plan.source_reads == {0: (3, 6)} and not plan.kafka_reads
    assert commit_metadata_for(plan, 2)["watermark"] == 8


def test_offsets_lost_to_retention_are_an_error_or_skipped_on_request(tmp_path):
    position = BackfillPosition()
    ranges = {0: PartitionRange(40, 100)}
    with pytest.raises(UpstreamError, match=r"no longer holds offsets 0\.\.39 .*earliest_available"):
        plan_round(_job(tmp_path), position, SourcePosition(), ranges, budget=10)
    plan = plan_round(_job(tmp_path, start="earliest_available"), position, SourcePosition(), ranges, budget=10)
    assert plan.kafka_reads == {0: (40, 50)}
    resumed = BackfillPosition(splits={0: SplitState(BACKFILLING, 20)})
    with pytest.raises(UpstreamError, match="21..39"):  # a gap in the middle is never skipped
        plan_round(_job(tmp_path, start="earliest_available"), resumed, SourcePosition(), ranges, budget=10)


def test_declarations_refuse_bad_input(tmp_path):
    with pytest.raises(BackfillConfigError, match="bootstrap_servers"):
        KafkaTopic("localhost", "orders", "id BIGINT")
    with pytest.raises(BackfillConfigError, match="already has"):
        KafkaTopic("127.0.0.1:9092", "orders", "_offset BIGINT, id BIGINT")
    _job(tmp_path, query="SELECT customer, SUM(amount) AS total FROM source GROUP BY customer").check_query()
    with pytest.raises(UnsupportedQueryError, match="COUNT\\(DISTINCT"):
        _job(tmp_path, query="SELECT customer, COUNT(DISTINCT id) AS n FROM source GROUP BY customer").check_query()
    with pytest.raises(UnsupportedQueryError, match="JOIN"):
        _job(tmp_path, query="SELECT s.id FROM source s JOIN source t ON s.id = t.id").check_query()
    with pytest.raises(BackfillConfigError, match="start must be one of"):
        _job(tmp_path, start="latest")
    with pytest.raises(BackfillConfigError, match="target must differ"):
        _job(tmp_path, target=str(tmp_path / "src"))


def test_backfilled_fraction_and_status_table(tmp_path):
    from airflow_backfill.kafka.status import SplitStatus, format_status

    halfway = SplitStatus(0, SplitState(BACKFILLING, 49), source_committed=80, kafka_earliest=0, kafka_end=100)
    assert halfway.backfilled_fraction == pytest.approx(0.5)
    assert SplitStatus(1, split_state.backfilling(), -1, 0, 0).backfilled_fraction == 1.0
    assert SplitStatus(2, SplitState(SOURCE_CACHING_UP, 9), 3, 0, 10).backfilled_fraction == 1.0
    text = format_status(_job(tmp_path), [halfway])
    assert "0/1 partitions Finished" in text and "Backfilling(49)" in text and "50.0%" in text


def test_kafka_job_file_round_trip(tmp_path):
    from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline

    data = {
        "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", "value_schema": "id BIGINT"},
        "source_job": {"name": "orders_source", "table": str(tmp_path / "orders")},
        "backfill": {"name": "orders_mv", "query": "SELECT id FROM source", "target": str(tmp_path / "mv"),
                     "rate_limit": 1000},
    }
    pipeline = KafkaPipeline.from_mapping(data)
    assert pipeline.backfill.source_table == pipeline.source_job.table
    assert KafkaPipeline.from_mapping(pipeline.to_mapping()) == pipeline
    with pytest.raises(BackfillConfigError, match="missing sections \\['backfill'\\]"):
        KafkaPipeline.from_mapping({k: v for k, v in data.items() if k != "backfill"})
    with pytest.raises(BackfillConfigError, match="unexpected keyword argument 'parallelism'"):
        KafkaPipeline.from_mapping({**data, "backfill": {**data["backfill"], "parallelism": 3}})
    with pytest.raises(BackfillConfigError, match="does not exist"):
        load_kafka_pipeline(str(tmp_path / "missing.yaml"))


def test_the_loopback_broker_never_formats_with_an_id_read_as_an_option(monkeypatch):
    import uuid

    from airflow_backfill.kafka import loopback_broker

    ids = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(loopback_broker.uuid, "uuid4", lambda: next(ids))
    assert loopback_broker._cluster_id() == "EBAQEBAQEBAQEBAQEBAQEA"  # the first one began with "-"


def test_a_split_keeps_the_time_it_entered_its_state_until_it_moves(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(split_state.time, "time", lambda: clock[0])
    position = BackfillPosition(splits={0: SplitState(SOURCE_CACHING_UP, 12, since=900.0), 1: SplitState(BACKFILLING, 3)})
    ranges = {0: PartitionRange(0, 13), 1: PartitionRange(0, 10)}
    plan = plan_round(_job(tmp_path), position, SourcePosition(offsets={0: 11, 1: 5}), ranges, budget=100)
    assert plan.splits[0].since == 900.0  # still waiting for offset 12: since when it began
    assert plan.splits[1] == SplitState(SOURCE_CACHING_UP, 9) and plan.splits[1].since == 1000.0
    assert SplitState.from_json(plan.splits[1].to_json()).since == 1000.0


def test_waiting_splits_are_reported_with_their_offsets_and_the_source_job(tmp_path):
    from airflow_backfill.kafka.liveness import Running
    from airflow_backfill.kafka.status import waiting_report

    splits = {0: SplitState(FINISHED, 4), 1: SplitState(SOURCE_CACHING_UP, 229, since=0.0)}
    source = SourcePosition(offsets={0: 4, 1: 199})
    report = waiting_report(splits, source, None)
    assert report == ("split 1 waits for the source job to commit offset 229 (it has 199) since 1970-01-01 00:00:00 "
                      "UTC; no source job is running, so nothing moves them: start the source job (the task group's "
                      "source_job task, or spark_jobs/kafka_source.py)")
    running = Running("kafka_source", 42, "host-a", since=60.0, beat=61.0)
    assert "the source job is running (pid 42 on host-a, running since 00:01:00 UTC)" in waiting_report(
        splits, source, running)
    assert waiting_report({0: SplitState(FINISHED, 4)}, source, None) is None


def test_a_heartbeat_reads_as_running_until_it_is_stale_or_its_process_is_gone(tmp_path):
    import os
    import time

    from airflow_backfill.kafka.liveness import SOURCE_JOB, beating, running

    table = str(tmp_path / "orders")
    with beating(table, SOURCE_JOB, interval=0.05):
        found = running(table, SOURCE_JOB)
        assert found is not None and found.pid == os.getpid()
        assert running(table, SOURCE_JOB, now=time.time() + 60) is None  # stale: no beat for a minute
    assert running(table, SOURCE_JOB) is None  # removed when the block ends
    (tmp_path / "orders" / "_airflow_backfill" / "kafka_source.json").write_text(
        f'{{"pid": 999999999, "host": "{os.uname().nodename}", "since": {time.time()}, "beat": {time.time()}}}')
    assert running(table, SOURCE_JOB) is None  # a fresh beat of a process that is gone (killed)


def test_a_source_job_beside_a_backfill_stops_once_it_finished_or_none_runs(tmp_path, monkeypatch):
    from airflow_backfill.kafka import source_job
    from airflow_backfill.kafka.liveness import Running

    finished = [False]
    backfill = [Running("kafka_backfill", 1, "h", 0.0, 0.0)]
    clock = [0.0]
    monkeypatch.setattr(source_job, "backfill_position",
                        lambda target: BackfillPosition(splits={0: SplitState(FINISHED if finished[0] else BACKFILLING, 1)}))
    monkeypatch.setattr(source_job, "running", lambda uri, role: backfill[0])
    monkeypatch.setattr(source_job.time, "monotonic", lambda: clock[0])
    bound = source_job.BesideBackfill(str(tmp_path / "mv"), grace=30.0)
    assert bound.reached() is None
    backfill[0] = None
    assert bound.reached() is None
    clock[0] = 29.0
    assert bound.reached() is None
    clock[0] = 30.0
    assert bound.reached() == f"no backfill of {tmp_path / 'mv'} has been running for 30 s"
    finished[0] = True
    assert "is Finished" in (bound.reached() or "")
