"""OpenLineage for the phase tasks: the upstream in, the MV out, column lineage, watermark.

The MV writes go through the engine, not through a Spark write OpenLineage's Spark
listener would see with its tables, so the phase operators report the lineage
themselves (`get_openlineage_facets_on_complete`). Only imported when the OpenLineage
provider (the `openlineage` extra) asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import attr
from openlineage.client.event_v2 import Dataset, InputDataset, OutputDataset
from openlineage.client.facet_v2 import RunFacet, column_lineage_dataset

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_backfill.job import BackfillJob


@attr.define
class BackfillRunFacet(RunFacet):
    """The MV's watermark after this task: the upstream epoch (Delta version) it reflects."""

    job: str
    phase: str
    watermark: int | None

    @staticmethod
    def _get_schema() -> str:
        return "urn:airflow-backfill:facet:BackfillRunFacet:1"  # described in docs/lineage.md


def dataset_name(uri: str) -> tuple[str, str]:
    """(namespace, name) per OpenLineage's dataset naming for files and object stores:
    local paths are `file` + absolute path; `s3://bucket/key` is `s3://bucket` + `key`."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "file", os.path.abspath(parsed.path if parsed.scheme else uri)
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def column_lineage(job: BackfillJob) -> column_lineage_dataset.ColumnLineageDatasetFacet:
    """Each MV column from the upstream columns its expression reads (from the query's AST;
    a join's columns are first resolved to their upstreams by the join planner)."""
    import sqlglot
    from sqlglot import exp

    query, origin = _query_and_origins(job)
    select = sqlglot.parse_one(query, read="spark")
    fields: dict[str, column_lineage_dataset.Fields] = {}
    for projection in select.expressions:
        inner = projection.this if isinstance(projection, exp.Alias) else projection
        direct = isinstance(inner, exp.Column)
        kind = "IDENTITY" if direct else ("AGGREGATION" if inner.find(exp.AggFunc) else "TRANSFORMATION")
        transformation = column_lineage_dataset.Transformation(type="DIRECT", subtype=kind)
        columns = sorted({origin(column.name) for column in inner.find_all(exp.Column)})
        fields[projection.alias_or_name] = column_lineage_dataset.Fields(
            inputFields=[
                column_lineage_dataset.InputField(namespace=namespace, name=name, field=column,
                                                  transformations=[transformation])
                for namespace, name, column in columns
            ],
            transformationType="IDENTITY" if direct else "TRANSFORMATION",
            transformationDescription=inner.sql(dialect="spark"),
        )
    return column_lineage_dataset.ColumnLineageDatasetFacet(fields=fields)


def _query_and_origins(job: BackfillJob) -> tuple[str, Callable[[str], tuple[str, str, str]]]:
    """The query whose columns are upstream columns, and where each column comes from:
    (namespace, dataset name, column)."""
    if not job.is_join:
        namespace, name = dataset_name(job.source)
        return job.query, lambda column: (namespace, name, column)
    from airflow_backfill.engine.joins.rounds import join_plan

    plan = join_plan(job)
    datasets = {upstream.name: dataset_name(upstream.table) for upstream in job.upstreams}

    def origin(column: str) -> tuple[str, str, str]:
        upstream, _, name = column.partition("__")
        return (*datasets[upstream], name)

    return plan.flat.query, origin


def _inputs(job: BackfillJob) -> list[Dataset]:
    return [InputDataset(namespace=namespace, name=name)
            for namespace, name in (dataset_name(upstream.table) for upstream in job.upstreams)]


def phase_lineage(job: BackfillJob, phase: str, watermark: int | None) -> OperatorLineage:
    """The lineage of one phase task that committed the MV at `watermark` (every upstream
    of a join is an input)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    target_namespace, target_name = dataset_name(job.target)
    facets: dict[str, Any] = {"columnLineage": column_lineage(job)}
    target: Dataset = OutputDataset(namespace=target_namespace, name=target_name, facets=facets)
    run_facets: dict[str, Any] = {"airflowBackfill": BackfillRunFacet(job=job.name, phase=phase, watermark=watermark)}
    return OperatorLineage(inputs=_inputs(job), outputs=[target], run_facets=run_facets)


def verify_lineage(job: BackfillJob) -> OperatorLineage:
    """The lineage of a verification: it reads the upstreams and the MV, writes nothing."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    target_namespace, target_name = dataset_name(job.target)
    return OperatorLineage(inputs=[*_inputs(job), InputDataset(namespace=target_namespace, name=target_name)])
