"""The Airflow plugin the provider ships (registered through the provider info's `plugins`).

It mounts the FastAPI app of `api.py` at `/airflow-backfill` in the API server and adds
a "Backfill progress" entry to the UI's Browse menu that shows the page inside the UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_backfill.links.progress import PLUGIN_URL_PREFIX, BackfillProgressLink
from airflow_backfill.plugins.api import create_app


class BackfillProgressPlugin(AirflowPlugin):
    """Backfill progress in the Airflow UI, with authenticated live control."""

    name = "airflow_backfill"
    fastapi_apps = [
        {"app": create_app(), "url_prefix": PLUGIN_URL_PREFIX, "name": "Backfill progress"},
    ]
    external_views = [
        {
            "name": "Backfill progress",
            "href": f"{PLUGIN_URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "airflow-backfill",
        },
    ]
    operator_extra_links = [BackfillProgressLink()]
