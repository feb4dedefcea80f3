"""Provider metadata read by Airflow's provider discovery.

Imports nothing heavy: discovery runs in every Airflow process. The UI plugin is not listed
here but registered on the `airflow.plugins` entry point (setup.cfg), which Airflow loads
whatever `[core] lazy_discover_providers` says; listed here too, an Airflow with eager
discovery would load it a second time and report "already registered" as an import error.
"""

from __future__ import annotations

from typing import Any

from airflow_backfill import __version__
from airflow_backfill.config import provider_config


def get_provider_info() -> dict[str, Any]:
    """What `airflow providers list` shows; `package-name` must equal the distribution name."""
    return {
        "package-name": "airflow-backfill",
        "name": "Airflow Backfill",
        "description": "Backfill and incrementally maintain a materialized view over a live "
        "Delta Lake table, in three Spark phases: snapshot, log-store catch-up, forward.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Airflow Backfill",
                "external-doc-url": "https://delta.io/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Airflow Backfill",
                "python-modules": [
                    "airflow_backfill.operators.phases",
                    "airflow_backfill.operators.pin_epoch",
                    "airflow_backfill.operators.kafka",
                    "airflow_backfill.operators.shared_forward",
                    "airflow_backfill.operators.mv_ready",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Airflow Backfill",
                "python-modules": ["airflow_backfill.sensors.lag", "airflow_backfill.sensors.kafka",
                                   "airflow_backfill.sensors.consistent"],
            }
        ],
        "triggers": [
            {"integration-name": "Airflow Backfill",
             "python-modules": ["airflow_backfill.triggers.lag", "airflow_backfill.triggers.consistent",
                                "airflow_backfill.triggers.kafka", "airflow_backfill.triggers.mv_commits"]}
        ],
        "hooks": [
            {"integration-name": "Airflow Backfill", "python-modules": ["airflow_backfill.hooks.delta"]}
        ],
        "extra-links": ["airflow_backfill.links.progress.BackfillProgressLink"],
        "config": provider_config(),
    }
