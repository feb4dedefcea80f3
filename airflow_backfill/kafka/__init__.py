"""Kafka upstreams: a source job that ingests a topic into Delta, and a per-partition source backfill."""
