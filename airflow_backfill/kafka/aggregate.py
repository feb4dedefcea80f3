"""GROUP BY over a Kafka topic: each source backfill round folds its records into the
per-group state of `engine/aggregates` (`<target>/_airflow_backfill/agg_state`), then
into the MV.

Records only ever arrive, so a round's records are change rows that all add (+1): counts
and sums add up, MIN/MAX take the least/greatest of old and new, and no group is ever
read again from the upstream. COUNT(DISTINCT), which would need its groups' earlier
records, is refused. Both commits carry the round number as app transaction version and
the round's split states in their metadata, the state first: a run killed between them
leaves the state one round ahead, and the next round first brings the MV to the state
(its rows recomputed from the whole state) with the state's split states. So the MV's
split states always describe exactly the records its rows aggregate.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from airflow_backfill.engine.aggregates.apply import commit_round, touched_groups
from airflow_backfill.engine.aggregates.state import discard_state, read_state, state_uri
from airflow_backfill.engine.aggregates.view import analyse, cast_to, mv_changes, value_types, visible_rows
from airflow_backfill.engine.delta.commits import (
    CommitInfo,
    append,
    commit_watermark_only,
)
from airflow_backfill.engine.delta.log import METADATA_PREFIX, load_table, table_exists
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.query import QueryPlan
from airflow_backfill.engine.rounds.write import write_keyed
from airflow_backfill.exceptions import TargetError
from airflow_backfill.kafka.positions import BackfillPosition, backfill_position
from airflow_backfill.kafka.query import aggregate_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.job import BackfillJob
    from airflow_backfill.kafka.config import KafkaBackfillJob

log = logging.getLogger(__name__)

PHASE = "kafka_backfill"


@dataclass(frozen=True)
class RoundCommit(CommitInfo):
    """A round's commit facts: the Kafka fields (split states, round, source version) in
    place of the Delta phases' epoch and source."""

    kafka: dict[str, Any] = field(default_factory=dict)

    def user_metadata(self, job: Any) -> str:
        fields = {**self.kafka, "phase": self.phase, "rows": str(self.rows), **self.extra}
        return json.dumps({METADATA_PREFIX + key: value for key, value in fields.items()}, sort_keys=True)


def _as_job(job: KafkaBackfillJob) -> BackfillJob:
    """The engine's aggregate steps read only `target`, `app_id` and `round_plan` of a job."""
    return cast("BackfillJob", job)


def _state_round(job: KafkaBackfillJob) -> int | None:
    uri = state_uri(job.target)
    if not table_exists(uri):
        return None
    version = load_table(uri).transaction_version(job.app_id)
    return None if version is None else int(version)


def recover_state_ahead(spark: SparkSession, job: KafkaBackfillJob, position: BackfillPosition) -> BackfillPosition:
    """Bring the MV to the state after a run stopped between the state's and the MV's
    commits of a round; returns the MV's position afterwards."""
    if position.mv_version is None:
        return position
    state_round = _state_round(job)
    if state_round is None:
        raise TargetError(
            f"the aggregate state of Kafka MV {job.target} is missing; rebuild the MV: delete the target and "
            "run the backfill again."
        )
    if state_round < position.round:
        raise TargetError(
            f"the aggregate state of Kafka MV {job.target} is at round {state_round}, behind the MV's round "
            f"{position.round}: it was changed by something else. Rebuild the MV: delete the target and run the "
            "backfill again."
        )
    if state_round == position.round:
        return position
    plan = aggregate_plan(job.query)
    assert plan is not None and plan.aggregate is not None
    log.warning("aggregate state of %s is at round %s, the MV at %s (a run stopped between the two commits): "
                "bringing the MV up to the state", job.name, state_round, position.round)
    state_metadata = _latest_metadata(state_uri(job.target))
    state = read_state(spark, _as_job(job), [*sql.key_columns(plan.aggregate), *sql.state_value_columns(plan.aggregate)])
    old_rows = spark.read.format("delta").load(job.target)
    records = _record_schema(spark, job)
    new_rows = visible_rows(spark, plan.aggregate, state, value_types(spark, plan.aggregate, records), old_rows.schema)
    info = RoundCommit(phase=PHASE, epoch=state_round, parallelism=1, rows=0,
                       extra={"recovered_from_state": "true"}, kafka=state_metadata)
    write_keyed(spark, job.target, mv_changes(old_rows, new_rows, plan.mv_key), plan.mv_key, app_id=job.app_id,
                version=state_round, user_metadata=info.user_metadata(job), null_safe=True)
    return backfill_position(job.target)


def _latest_metadata(uri: str) -> dict[str, Any]:
    """The Kafka fields of the latest commit of `uri` (without the prefix)."""
    from airflow_backfill.engine.delta.log import commit_history, commit_metadata

    entry = commit_history(uri, limit=1)[0]
    return {key: value for key, value in commit_metadata(entry).items() if key not in ("phase", "rows")}


def _record_schema(spark: SparkSession, job: KafkaBackfillJob) -> Any:
    from airflow_backfill.kafka.records import empty_records

    return empty_records(spark, job.upstream).schema


def commit_aggregate_round(
    spark: SparkSession, job: KafkaBackfillJob, records: DataFrame, round_number: int, metadata: dict[str, Any],
) -> None:
    """Fold `records` (this round's, all new) into the state, then the MV, with `metadata`."""
    plan = aggregate_plan(job.query)
    assert plan is not None and plan.aggregate is not None
    info = RoundCommit(phase=PHASE, epoch=round_number, parallelism=1, rows=0, kafka=metadata)
    if not table_exists(job.target):
        _create(spark, job, plan, records, info)
        return
    signed = records.selectExpr("*", f"1 AS {sql.SIGN}")
    state = read_state(spark, _as_job(job), [*sql.key_columns(plan.aggregate), *sql.state_value_columns(plan.aggregate)])
    rows = touched_groups(spark, _as_job(job), plan.aggregate, signed, state, records.schema, round_number).cache()
    try:
        if rows.isEmpty():  # no record passed WHERE: the split states move all the same
            _commit_split_states_only(spark, job, info)
            return
        commit_round(spark, _as_job(job), plan, plan.aggregate, rows, info, recompute_at=None)
    finally:
        rows.unpersist()


def _create(spark: SparkSession, job: KafkaBackfillJob, plan: QueryPlan, records: DataFrame, info: RoundCommit) -> None:
    """The first round: the state of its records, then the MV from it."""
    aggregate = plan.aggregate
    assert aggregate is not None
    if discard_state(job.target):
        log.info("a first round stopped between its two commits; its state was discarded")
    state_schema = analyse(spark, records.schema, sql.state_sql(aggregate))  # binds `source` to no rows
    records.createOrReplaceTempView("source")
    state = cast_to(spark.sql(sql.state_sql(aggregate)), state_schema)
    append(state, state_uri(job.target), app_id=job.app_id, version=info.epoch,
           user_metadata=info.user_metadata(job), create=True)
    maybe_crash(PHASE, "after_state_commit")
    mv_schema = analyse(spark, records.schema, job.query)
    committed = spark.read.format("delta").load(state_uri(job.target))
    mv_rows = visible_rows(spark, aggregate, committed, value_types(spark, aggregate, records.schema), mv_schema)
    append(mv_rows, job.target, app_id=job.app_id, version=info.epoch,
           user_metadata=replace(info, extra={"groups": str(committed.count())}).user_metadata(job), create=True)


def _commit_split_states_only(spark: SparkSession, job: KafkaBackfillJob, info: RoundCommit) -> None:
    metadata = info.user_metadata(job)
    commit_watermark_only(spark, state_uri(job.target), app_id=job.app_id, version=info.epoch,
                          user_metadata=metadata)
    maybe_crash(PHASE, "after_state_commit")
    commit_watermark_only(spark, job.target, app_id=job.app_id, version=info.epoch, user_metadata=metadata)
