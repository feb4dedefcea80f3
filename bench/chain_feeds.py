"""Feed rows along the chains: what an MV over an MV reads per row its source MV changed.

    python -m bench.chain_feeds SPEC.json OUT.json

For each link of a chain (a source MV and the MV over it), over the source MV's versions
committed in the measured window: the rows of its change feed (Spark's change-feed reader,
which derives rows from change files, deletion vectors and rewritten files alike) against
the MV rows that really changed (keys whose rows before and after the version differ:
each feed row hashed, the pre-images and deletes counted against the post-images and
inserts, per version and key). An update writes 2 feed rows per changed row; a round that
rewrites a whole MV feeds every row of it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.local_spark import delta_session
from bench.mv_freshness import log_commits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BEFORE = ("delete", "update_preimage")
FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
MAX_VERSIONS = 40
"""Versions read per link at most (the window's last ones): a whole-MV rewrite of a
2 M-row MV feeds 4 M rows a version."""


def links(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """(source MV, the MV over it, the source MV's table and key) for every MV over an MV;
    the reader's primary key is its source MV's key."""
    by_target = {job["target"]: job for job in jobs}
    return [{"source": by_target[job["source"]]["name"], "reader": job["name"], "uri": job["source"],
             "key": list(job["primary_key"])} for job in jobs if job.get("source") in by_target]


def window_versions(uri: str, start: float, end: float) -> list[int]:
    """The table's versions committed in [start, end], the last `MAX_VERSIONS` of them."""
    versions = [c["version"] for c in log_commits(uri)
                if c["timestamp"] is not None and start <= c["timestamp"] / 1000.0 <= end]
    return versions[-MAX_VERSIONS:]


def link_feed(spark: SparkSession, uri: str, key: Sequence[str], first: int, last: int) -> tuple[int, int]:
    """(feed rows, changed MV rows) of versions first..last of the table."""
    from pyspark.sql import functions as F

    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", first)
            .option("endingVersion", last).load(uri))
    values = [column for column in feed.columns if column not in FEED_COLUMNS]
    signed = feed.select("_commit_version", *key, F.xxhash64(*values).alias("image"),
                         F.when(F.col("_change_type").isin(*BEFORE), -1).otherwise(1).alias("sign"))
    net = signed.groupBy("_commit_version", *key, "image").agg(F.sum("sign").alias("net"))
    changed = net.filter(F.col("net") != 0).select("_commit_version", *key).distinct()
    return feed.count(), changed.count()


def measure(spark: SparkSession, jobs: Sequence[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    found = []
    for link in links(jobs):
        versions = window_versions(link["uri"], start, end)
        rows, changed = link_feed(spark, link["uri"], link["key"], versions[0], versions[-1]) if versions else (0, 0)
        found.append({"source": link["source"], "reader": link["reader"], "versions": len(versions),
                      "feed_rows": rows, "changed_rows": changed,
                      "feed_rows_per_changed_row": round(rows / changed, 2) if changed else None})
    return found


def main(argv: Sequence[str] | None = None) -> int:
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    spec = json.loads(open(spec_path).read())
    spark = delta_session("bench:chain_feeds", cores=2, settings={"spark.sql.shuffle.partitions": "2"})
    try:
        result = measure(spark, spec["jobs"], spec["start"], spec["end"])
    finally:
        spark.stop()
    with open(out_path, "w") as out:
        json.dump(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
