"""The job a phase task submits, written to a file that its spark-submit command names.

The task's log shows the spark-submit command, so that a person can copy it and rerun
the phase by hand. A job passed inline cannot be copied from there: Airflow masks any log
text starting with `eyJ` (it takes it for a JWT), which base64 of a JSON object always
does, and the Spark provider logs the arguments joined by spaces, unquoted. A file path
survives both. The file holds the job's fields only (an `aws_conn_id` names a connection;
its secret never leaves Airflow's connections).

The name is the job's name and a digest of its content: a rerun of the same job writes
the same file, and a file a log already names is never rewritten with other content.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

JOB_FILES_FOLDER = os.path.join("airflow_backfill", "jobs")
"""Under Airflow's `[logging] base_log_folder`, beside the task logs that name the files."""


def job_files_folder() -> Path:
    """Where the job files go: `<[logging] base_log_folder>/airflow_backfill/jobs`."""
    from airflow.configuration import conf

    return Path(conf.get("logging", "base_log_folder")) / JOB_FILES_FOLDER


def write_job_file(name: str, text: str) -> str:
    """Write `text` (a job as JSON, which job files read as YAML) atomically to
    `<job_files_folder()>/<name>-<digest>.json` and return the file's absolute path."""
    folder = job_files_folder()
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = (folder / f"{name}-{digest}.json").resolve()
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)
    return str(path)
