"""The extra link from a phase's task instance to its job's page in the Airflow UI.

Airflow 3 evaluates a link in the worker and stores it as an XCom, so the link can use
the operator's job. The phases also push it when they start, so a running snapshot or
catch-up already links to its progress. The link opens the page inside Airflow's UI (the
plugin's React app, `/plugin/<UI_ROUTE>/jobs/<name>`), where a signed-out user is sent to
the login page first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

PLUGIN_URL_PREFIX = "/airflow-backfill"
"""Where the provider's FastAPI app is mounted in the Airflow API server."""
UI_ROUTE = "airflow-backfill"
"""The page's route in the Airflow UI: `/plugin/<UI_ROUTE>`."""


def job_page_path(job_name: str | None = None) -> str:
    """The page in the Airflow UI (of one job, or of every job), relative to the API
    server's root with its `base_url` path."""
    from airflow.configuration import conf

    base_path = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    page = f"{base_path}/plugin/{UI_ROUTE}"
    return page if job_name is None else f"{page}/jobs/{quote(job_name, safe='')}"


class BackfillProgressLink(BaseOperatorLink):
    """"Backfill progress": the job's phase, watermark, lag, progress and controls."""

    name = "Backfill progress"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        job: Any = getattr(operator, "job", None)
        name = getattr(job, "name", None)
        return job_page_path(name) if isinstance(name, str) else ""
