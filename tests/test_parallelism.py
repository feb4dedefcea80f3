"""The parallelism -> Spark settings mapping (pure, no Spark): local[N] embedded, executors
x cores (or dynamic-allocation bounds) on a cluster, N shuffle partitions everywhere."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.parallelism import (
    DEFAULT_EXECUTOR_CORES,
    executor_shape,
    is_local_master,
    runtime_conf_for,
    spark_conf_for,
)
from airflow_backfill.engine.spark_session import spark_conf_for_parallelism
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import MAX_PARALLELISM

LOCAL_MASTERS = ["local", "local[1]", "local[*]", "local[4,2]"]
CLUSTER_MASTERS = ["spark://host:7077", "yarn", "k8s://https://api:6443", "local-cluster[2,1,1024]"]
PARALLELISMS = [1, 2, 3, 5, 7, 8, 13, 64, 100, MAX_PARALLELISM]


@pytest.mark.parametrize("master", LOCAL_MASTERS)
@pytest.mark.parametrize("parallelism", PARALLELISMS)
def test_local_masters_become_local_n(master, parallelism):
    conf = spark_conf_for(parallelism, master)
    assert is_local_master(master)
    assert conf["spark.master"] == f"local[{parallelism}]"
    assert conf["spark.sql.shuffle.partitions"] == str(parallelism)
    assert conf["spark.default.parallelism"] == str(parallelism)
    assert not any(key.startswith(("spark.executor.", "spark.dynamicAllocation.")) for key in conf)


@pytest.mark.parametrize("master", CLUSTER_MASTERS)
@pytest.mark.parametrize("parallelism", PARALLELISMS)
@pytest.mark.parametrize("executor_cores", [None, 1, 3, 4, 16])
def test_cluster_masters_get_executors_covering_the_parallelism(master, parallelism, executor_cores):
    conf = spark_conf_for(parallelism, master, executor_cores=executor_cores)
    limit = DEFAULT_EXECUTOR_CORES if executor_cores is None else executor_cores
    executors, cores = int(conf["spark.executor.instances"]), int(conf["spark.executor.cores"])
    slots = executors * cores
    assert "spark.master" not in conf, "a cluster master is the cluster's to choose"
    assert 1 <= cores <= min(limit, parallelism)
    assert slots >= parallelism, "fewer task slots than the parallelism"
    assert slots < parallelism + executors, "more than one spare slot per executor"
    assert executors == -(-parallelism // limit), "not the fewest executors of at most `limit` cores"
    assert int(conf["spark.cores.max"]) == slots
    assert conf["spark.sql.shuffle.partitions"] == conf["spark.default.parallelism"] == str(parallelism)


@pytest.mark.parametrize("parallelism", PARALLELISMS)
def test_dynamic_allocation_bounds_the_executors_instead_of_fixing_them(parallelism):
    fixed = spark_conf_for(parallelism, "yarn", executor_cores=4)
    dynamic = spark_conf_for(parallelism, "yarn", executor_cores=4, dynamic_allocation=True)
    assert "spark.executor.instances" not in dynamic
    bounds = [int(dynamic[f"spark.dynamicAllocation.{name}Executors"]) for name in ("min", "initial", "max")]
    assert bounds == sorted(bounds) and bounds[0] >= 1
    assert bounds[-1] == int(fixed["spark.executor.instances"])
    assert dynamic["spark.executor.cores"] == fixed["spark.executor.cores"]


@pytest.mark.parametrize("parallelism", PARALLELISMS)
def test_runtime_settings_are_the_subset_a_running_session_can_change(parallelism):
    runtime = runtime_conf_for(parallelism)
    assert runtime == {"spark.sql.shuffle.partitions": str(parallelism)}
    for master in LOCAL_MASTERS + CLUSTER_MASTERS:
        assert runtime.items() <= spark_conf_for(parallelism, master).items()
    assert spark_conf_for_parallelism(parallelism).items() <= spark_conf_for(parallelism, "yarn").items()


@pytest.mark.parametrize("value", [0, -1, MAX_PARALLELISM + 1, "2", 2.0, True, None])
def test_invalid_parallelism_is_refused_with_the_bounds(value):
    with pytest.raises(BackfillConfigError) as caught:
        spark_conf_for(value, "local[*]")
    message = str(caught.value)
    assert message.startswith("parallelism must be") and f"got {value!r}" in message
    assert f"between 1 and {MAX_PARALLELISM}" in message


@pytest.mark.parametrize("master", ["", "mesos://host:5050", "lokal[2]", None])
def test_unknown_masters_are_refused_with_the_supported_forms(master):
    with pytest.raises(BackfillConfigError, match=r"unsupported Spark master .*use local\[N\]"):
        spark_conf_for(2, master)


@pytest.mark.parametrize("cores", [0, -2, 257, True])
def test_invalid_executor_cores_name_the_setting(cores):
    with pytest.raises(BackfillConfigError, match="spark.executor.cores must be"):
        executor_shape(8, cores)
