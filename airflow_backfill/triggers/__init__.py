"""Triggers that wait in Airflow's triggerer."""

DEFAULT_POLL_INTERVAL = 10.0
"""Seconds between two reads of the Delta logs by a trigger: one triggerer serves many sensors."""
