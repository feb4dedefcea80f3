"""Only what setup.cfg cannot say: the packages, with `spark_jobs/` mapped into the package.

The spark-submit entry points stay at the top of the checkout (`spark_jobs/`, run by hand
as `spark-submit spark_jobs/forward.py`) but are installed as `airflow_backfill.spark_jobs`,
a name no other distribution can shadow.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["airflow_backfill", "airflow_backfill.*"]), "airflow_backfill.spark_jobs"],
    package_dir={"airflow_backfill.spark_jobs": "spark_jobs"},
)
