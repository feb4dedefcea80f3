"""The provider's Airflow UI plugin: backfill progress and live control (see progress.py)."""
