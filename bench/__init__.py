"""The TPC-H benchmark of airflow_backfill: `python bench/run.py --help`."""
