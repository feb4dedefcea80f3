"""The JVM libraries the provider needs besides pyspark's, as Spark users get them.

Delta Lake's, Spark's Kafka connector's, Hadoop's S3A and Apache Kafka's broker jars are
Maven coordinates pinned in the poms of `poms/` (package data), resolved once into the
provider's user cache by `airflow-backfill jars fetch` (`libraries.py`, `fetch.py`); never
at run time. The one jar this project compiles (`airflow-backfill-local-fs.jar`, Hadoop's
local file system without child processes) is built when the wheel is built and ships
beside these modules, when a JDK and pyspark's jars were there to build it.
"""
