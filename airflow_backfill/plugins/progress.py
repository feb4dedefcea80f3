"""The Airflow plugin the provider ships (registered through the provider info's `plugins`).

It mounts the FastAPI app of `api.py` at `/airflow-backfill` in the API server and adds
"Backfill progress" to the UI's Browse menu: a React app (page.py) that the UI renders
at `/plugin/airflow-backfill`, one job at `/plugin/airflow-backfill/jobs/<name>`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_backfill.links.progress import PLUGIN_URL_PREFIX, UI_ROUTE, BackfillProgressLink
from airflow_backfill.plugins.api import create_app


class BackfillProgressPlugin(AirflowPlugin):
    """Backfill progress in the Airflow UI, with authenticated live control."""

    name = "airflow_backfill"
    fastapi_apps = [
        {"app": create_app(), "url_prefix": PLUGIN_URL_PREFIX, "name": "Backfill progress"},
    ]
    react_apps = [
        {
            "name": "Backfill progress",
            # Relative to the UI's base URL, so a base_url with a path works too.
            "bundle_url": f"{PLUGIN_URL_PREFIX.lstrip('/')}/static/backfill_progress.js",
            "destination": "nav",
            "category": "browse",
            "url_route": UI_ROUTE,
        },
    ]
    operator_extra_links = [BackfillProgressLink()]
