"""The FastAPI app of the UI plugin: the jobs' status as JSON, live control, and the page's
script (a React app that Airflow's UI loads, see page.py).

Every JSON route needs an authenticated Airflow user (the API server's JWT, as a bearer
token or the UI's cookie) and asks Airflow's auth manager, for every DAG that declares
the job: reading needs DAG read permission (GET), altering DAG edit permission (PUT). A
job is addressed by its name only, looked up in the jobs the DAGs declare (`jobs.py`,
from the metadata database), so no request can reach a path or run DAG code. Alters go
through `apply_alter`, like `airflow-backfill alter`. The old page addresses redirect
into Airflow's UI, which sends signed-out users to its login page.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, RedirectResponse

from airflow_backfill.engine.alter import AlterResult, apply_alter
from airflow_backfill.engine.control import BackfillSettings, read_overrides, validate_override_rate_limit
from airflow_backfill.engine.job_state import read_state
from airflow_backfill.engine.lag_history import CommitTimes, lag_history
from airflow_backfill.exceptions import BackfillConfigError, BackfillError
from airflow_backfill.job import BackfillJob, validate_parallelism
from airflow_backfill.links.progress import job_page_path
from airflow_backfill.plugins.jobs import JobRegistry, KnownJob, KnownPipeline
from airflow_backfill.plugins.page import PAGE_SCRIPT

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

log = logging.getLogger(__name__)

READ: ResourceMethod = "GET"
EDIT: ResourceMethod = "PUT"
ALTERABLE = ("backfill_parallelism", "rate_limit")
ACTIONS = ("reset", "resume")
"""Body flags that take no value besides `true`: back to the job's values, lift a pause."""


class AlterRequestError(ValueError):
    """A body the alter endpoint refuses (400), with a message that says what to send."""


def parse_alter_body(body: Any) -> tuple[dict[str, Any], str | None]:
    """(overrides, action) from a JSON body, validated like `airflow-backfill alter`'s options;
    the action is "reset", "resume" or None (store the overrides)."""
    if not isinstance(body, dict):
        raise AlterRequestError('the body must be a JSON object such as {"backfill_parallelism": 2}.')
    unknown = sorted(set(body) - {*ALTERABLE, *ACTIONS})
    if unknown:
        raise AlterRequestError(
            f"unknown field(s) {', '.join(unknown)}; send backfill_parallelism, rate_limit, resume or reset."
        )
    for flag in ACTIONS:
        if flag in body and body[flag] is not True:
            raise AlterRequestError(f"{flag} can only be true, got {body[flag]!r}; leave it out otherwise.")
    actions = [flag for flag in ACTIONS if flag in body]
    overrides = {key: body[key] for key in ALTERABLE if key in body}
    if len(actions) > 1:
        raise AlterRequestError("reset already lifts a pause; send reset or resume, not both.")
    if actions and overrides:
        raise AlterRequestError(
            f"{actions[0]} cannot be combined with {' or '.join(overrides)}; send two requests."
        )
    if not actions and not overrides:
        raise AlterRequestError(
            "nothing to alter: send backfill_parallelism, rate_limit (0 pauses, null lifts the cap), "
            "resume: true or reset: true."
        )
    try:
        if "backfill_parallelism" in overrides:
            validate_parallelism("backfill_parallelism", overrides["backfill_parallelism"])
        if "rate_limit" in overrides:
            validate_override_rate_limit(overrides["rate_limit"])
    except BackfillConfigError as error:
        raise AlterRequestError(str(error)) from None
    return overrides, (actions[0] if actions else None)


def _is_authorized(user: BaseUser, method: ResourceMethod, known: KnownJob | KnownPipeline) -> bool:
    """True when the user may `method` every DAG that declares the job."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    manager = get_auth_manager()
    return all(
        manager.is_authorized_dag(
            method=method, user=user, details=DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
        )
        for dag_id in known.dag_ids
    )


def _settings(settings: BackfillSettings | None) -> dict[str, Any] | None:
    if settings is None:
        return None
    return {"backfill_parallelism": settings.backfill_parallelism, "rate_limit": settings.rate_limit,
            "altered": settings.altered, "paused": settings.paused}


def register_job_storage(job: BackfillJob) -> None:
    """Tables on S3 are read with the job's `aws` connection (see hooks/delta.py)."""
    if job.aws_conn_id:
        from airflow_backfill.hooks.delta import DeltaBackfillHook

        DeltaBackfillHook.for_job(job).register_storage()


FULL_VIEWS = 10
"""Up to this many jobs, the list sends every job whole (commits, rounds, lag history);
above it, a summary per job (phase, state, lag, each upstream's lag), which the page
shows as one table that sorts and filters, and each job's own page the rest."""
VIEW_THREADS = 8
"""Jobs read at once for the list (each view reads a few Delta logs, mostly waiting on files)."""
SUMMARY_STATUS_FIELDS = ("phase", "state", "watermark", "upstream_version", "pending_epochs", "lag_seconds",
                         "mv_version", "upstreams", "source", "target")

_commit_times = CommitTimes()
"""Upstream commit times the lag history has read, kept for the life of the API server."""


def job_view(known: KnownJob, *, can_edit: bool) -> dict[str, Any]:
    """One job for the page: its DAGs and tasks, `JobStatus.to_dict()` as `status --json`
    prints it, the lag after each MV commit, and whether the user may alter it."""
    from airflow_backfill.engine.status import job_status

    view: dict[str, Any] = {
        "name": known.name, "kind": "join" if known.job.is_join else "delta", "summary": False,
        "dag_ids": list(known.dag_ids), "can_edit": can_edit,
        "settings": {"lag_threshold": known.job.lag_threshold, "parallelism": known.job.parallelism},
        "tasks": [{"dag_id": task.dag_id, "task_id": task.task_id, "task_type": task.task_type}
                  for task in known.tasks],
        "status": None, "lag_history": [], "error": None,
    }
    try:
        register_job_storage(known.job)
        status = job_status(known.job)
        view["status"] = json.loads(json.dumps(status.to_dict(), sort_keys=True, default=str))
        # A join's commits record a vector of upstream versions, which this history does not
        # read yet: its view has no lag history; its status lists the lag per upstream.
        view["lag_history"] = [] if known.job.is_join else [
            asdict(point) for point in lag_history(known.job.source, status.commits, status.upstream_version,
                                                   _commit_times)
        ]
        view.update(_errors(read_state(known.job.target)))
    except BackfillError as error:  # a damaged state file: shown, not a server error
        view["error"] = str(error)
    return view


def job_summary(known: KnownJob, *, can_edit: bool) -> dict[str, Any]:
    """One job as a row of the list: its phase, state, lag and each upstream's lag."""
    from airflow_backfill.engine.status import job_status

    view: dict[str, Any] = {"name": known.name, "kind": "join" if known.job.is_join else "delta", "summary": True,
                            "dag_ids": list(known.dag_ids), "can_edit": can_edit, "status": None, "error": None}
    try:
        register_job_storage(known.job)
        status = json.loads(json.dumps(job_status(known.job).to_dict(), sort_keys=True, default=str))
        view["status"] = {key: status.get(key) for key in SUMMARY_STATUS_FIELDS}
        view["status"]["paused"] = bool((status.get("control") or {}).get("paused"))
        view.update(_errors(read_state(known.job.target)))
    except BackfillError as error:
        view["error"] = str(error)
    return view


def _errors(state: dict[str, Any]) -> dict[str, Any]:
    """The last error of the shared forward's rounds and of its folder backfill (each
    cleared by the next success), as the page shows them."""
    return {"forward_error": state.get("forward_error"), "backfill_error": state.get("backfill_error")}


def pipeline_view(known: KnownPipeline) -> dict[str, Any]:
    """A Kafka pipeline: each split's state (from the MV's last commit), the source job's
    committed offsets and whether it runs, and how far the MV trails the source table.
    Read from the Delta logs only: the API server never contacts the brokers."""
    from airflow_backfill.kafka.liveness import SOURCE_JOB, running
    from airflow_backfill.kafka.positions import backfill_position, source_position

    backfill = known.pipeline.backfill
    view: dict[str, Any] = {
        "name": known.name, "kind": "kafka", "summary": True, "dag_ids": list(known.dag_ids), "can_edit": False,
        "topic": backfill.upstream.topic, "source_job": known.pipeline.source_job.name,
        "source_table": backfill.source_table, "target": backfill.target, "splits": [], "error": None,
    }
    try:
        position = backfill_position(backfill.target)
        source = source_position(backfill.source_table)
        view["splits"] = [{"partition": partition, "state": state.kind, "offset": state.offset, "since": state.since,
                           "source_committed": source.committed(partition)}
                          for partition, state in sorted(position.splits.items())]
        finished = position.finished
        pending = (None if source.version is None or position.source_version is None
                   else max(0, source.version - position.source_version))
        view["status"] = {"phase": "forward" if finished else ("backfill" if position.splits else None),
                          "state": "created" if finished else ("creating" if position.splits else None),
                          "pending_epochs": pending if finished else None, "lag_seconds": None,
                          "watermark": position.source_version if finished else None,
                          "upstream_version": source.version, "mv_version": position.mv_version,
                          "source_job_running": running(backfill.source_table, SOURCE_JOB) is not None}
        view["forward_error"] = read_state(backfill.target).get("forward_error")
    except BackfillError as error:
        view["error"] = str(error)
        view["status"] = None
    return view


def create_app(registry: JobRegistry | None = None) -> FastAPI:
    """The plugin's app; `registry` lists the jobs the deployment's DAGs declare."""
    jobs = registry or JobRegistry()
    app = FastAPI(title="airflow-backfill", description="Backfill progress and live control")

    def authorized(job_name: str, user: BaseUser, method: ResourceMethod) -> KnownJob:
        known = jobs.get(job_name)
        if known is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no DAG declares a backfill job named {job_name!r}")
        if not _is_authorized(user, method, known):
            action = "read" if method == READ else "edit"
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"job {job_name} needs permission to {action} DAG(s) {', '.join(known.dag_ids)}",
            )
        return known

    @app.get("/")
    def index() -> RedirectResponse:
        """The page lives in Airflow's UI (which asks signed-out users to log in first)."""
        return RedirectResponse(job_page_path(), status.HTTP_302_FOUND)

    @app.get("/jobs/{job_name}")
    def job_page(job_name: str) -> RedirectResponse:
        """Links stored by earlier runs of the phases open the job in Airflow's UI."""
        return RedirectResponse(job_page_path(job_name), status.HTTP_302_FOUND)

    @app.get("/static/backfill_progress.js")
    def page_script() -> FileResponse:
        """The React app Airflow's UI loads (code only: no data, so no sign-in needed)."""
        return FileResponse(PAGE_SCRIPT, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    @app.get("/api/jobs")
    def list_jobs(user: GetUserDep, summary: bool | None = None) -> dict[str, Any]:
        """Every job the user may read: whole up to `FULL_VIEWS` jobs, else (or with
        `?summary=true`) one summary each; Kafka pipelines beside them (`kind: kafka`)."""
        readable = [known for known in jobs.jobs().values() if _is_authorized(user, READ, known)]
        pipelines = [known for known in jobs.pipelines().values() if _is_authorized(user, READ, known)]
        brief = summary if summary is not None else len(readable) + len(pipelines) > FULL_VIEWS
        view = job_summary if brief else job_view

        def one(known: KnownJob) -> dict[str, Any]:
            return view(known, can_edit=_is_authorized(user, EDIT, known))

        with ThreadPoolExecutor(max_workers=VIEW_THREADS) as pool:
            views = list(pool.map(one, readable))
            views += list(pool.map(pipeline_view, pipelines))
        return {"jobs": views, "summary": brief}

    @app.get("/api/jobs/{job_name}")
    def get_job(job_name: str, user: GetUserDep) -> dict[str, Any]:
        known = authorized(job_name, user, READ)
        return job_view(known, can_edit=_is_authorized(user, EDIT, known))

    @app.post("/api/jobs/{job_name}/alter")
    async def alter_job(job_name: str, request: Request, user: GetUserDep) -> dict[str, Any]:
        """Alter, resume or reset the backfill parallelism / rate limit; applies at the next chunk
        or round. The answer holds the settings before and after, the overrides now stored
        and when they apply."""
        known = await run_in_threadpool(authorized, job_name, user, EDIT)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "the body is not valid JSON") from None
        try:
            overrides, action = parse_alter_body(body)
            await run_in_threadpool(register_job_storage, known.job)
            result: AlterResult = await run_in_threadpool(
                apply_alter, known.job, overrides, reset=action == "reset", resume=action == "resume"
            )
            stored = await run_in_threadpool(read_overrides, known.job.target)
        except (AlterRequestError, BackfillConfigError) as error:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from None
        log.info("job %s altered by %s: %s", known.name, user.get_name(), action or overrides)
        return {"name": known.name, "action": action or "alter", "before": _settings(result.before),
                "after": _settings(result.after), "stored": stored, "message": result.safe_point.message}

    return app
