"""OpenLineage facets of the phase tasks: the upstream in, the MV out (dataset names per
the spec for files and object stores), column lineage from the query, the watermark."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow.providers.openlineage")

from conftest import context_with  # noqa: E402
from openlineage.client.serde import Serde  # noqa: E402

from airflow_backfill.lineage import dataset_name  # noqa: E402
from airflow_backfill.operators.phases import ForwardOperator, SnapshotBackfillOperator  # noqa: E402


def test_dataset_names_follow_the_openlineage_spec():
    assert dataset_name("/data/orders") == ("file", "/data/orders")
    assert dataset_name("file:///data/orders") == ("file", "/data/orders")
    assert dataset_name("s3://lake/tables/orders") == ("s3://lake", "tables/orders")


def test_a_phase_reports_upstream_mv_column_lineage_and_watermark(job, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from helpers_delta import write_mv_version
    from test_phase_operators import MV_ROWS

    job = job.with_overrides(query="SELECT order_id, amount * 2 AS doubled FROM source WHERE amount > 0")
    monkeypatch.setattr(SparkSubmitOperator, "execute",
                        lambda operator, context: write_mv_version(job.target, MV_ROWS, job.app_id, watermark=4))
    operator = SnapshotBackfillOperator(task_id="snapshot", job=job)
    operator.execute(context_with())
    lineage = operator.get_openlineage_facets_on_complete(task_instance=None)

    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", job.source)]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", job.target)]
    fields = lineage.outputs[0].facets["columnLineage"].fields
    assert {column: [f.field for f in fields[column].inputFields] for column in fields} == {
        "order_id": ["order_id"], "doubled": ["amount"]}
    assert fields["order_id"].transformationType == "IDENTITY"
    assert fields["doubled"].transformationType == "TRANSFORMATION"
    facet = Serde.to_dict(lineage.run_facets["airflowBackfill"])
    assert (facet["job"], facet["phase"], facet["watermark"]) == ("orders_mv", "snapshot", 4)


def test_without_a_run_the_watermark_comes_from_the_delta_log(job):
    from helpers_delta import write_mv_version
    from test_phase_operators import MV_ROWS

    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=9)
    lineage = ForwardOperator(task_id="forward", job=job).get_openlineage_facets_on_complete(task_instance=None)
    assert lineage.run_facets["airflowBackfill"].watermark == 9
    assert lineage.run_facets["airflowBackfill"].phase == "forward"


def test_verify_reads_the_upstream_and_the_mv_and_writes_nothing(job):
    from airflow_backfill.operators.phases import VerifyOperator

    lineage = VerifyOperator(task_id="verify", job=job).get_openlineage_facets_on_complete(task_instance=None)
    assert [d.name for d in lineage.inputs] == [job.source, job.target] and lineage.outputs == []
