"""How to reach an S3-compatible store, and the one channel credentials travel on.

The Airflow side reads them from an Airflow connection of the Amazon provider's `aws`
type and hands them to `spark-submit` as environment variables (never on a command
line, in a log or in XCom). The Spark driver reads them back from its environment and
configures delta-rs (`storage_options`), pyarrow's S3 file system and Hadoop's S3A
connector, whose settings Spark ships to the executors with each job.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlparse

from airflow_backfill.exceptions import AccessDeniedError, BackfillConfigError
from airflow_backfill.storage.uri import bucket_of, is_object_store

ENVIRONMENT = {
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "endpoint_url": "AWS_ENDPOINT_URL",
}
"""The AWS SDKs' own variable names, so that a process started with them by hand works too."""
DEFAULT_REGION = "us-east-1"
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"


@dataclass(frozen=True)
class S3Settings:
    """Endpoint, region and credentials of one S3-compatible store.

    `repr` never shows the secret or the session token.
    """

    endpoint_url: str | None = None
    """None for AWS itself; e.g. http://127.0.0.1:9000 for a local server."""
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:
        secret = "***" if self.secret_access_key else None
        return (f"S3Settings(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
                f"access_key_id={self.access_key_id!r}, secret_access_key={secret!r})")

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint_url) and self.endpoint_url.startswith("http://")  # type: ignore[union-attr]

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> S3Settings:
        """The settings this process was started with (AWS_* variables)."""
        environ = dict(os.environ if environ is None else environ)
        values = {name: environ.get(variable) or None for name, variable in ENVIRONMENT.items()}
        values["region"] = values["region"] or environ.get("AWS_DEFAULT_REGION") or None
        return cls(**values)

    def environment(self) -> dict[str, str]:
        """The variables a child process (spark-submit) reads these settings from."""
        return {ENVIRONMENT[f.name]: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    def secrets(self) -> list[str]:
        """Values that must be masked wherever they could be printed."""
        return [value for value in (self.secret_access_key, self.session_token) if value]

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs `storage_options` (read side; writers add their commit coordination)."""
        options = {**self.environment(), "AWS_REGION": self.region or DEFAULT_REGION}
        if self.plain_http:
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    def hadoop_conf(self, *, with_secrets: bool) -> dict[str, str]:
        """Hadoop settings for S3A; `s3://` is served by S3A too, so one URI names a
        table for delta-rs and for Spark alike. Without secrets: what may appear on a
        command line."""
        conf = {
            "fs.s3.impl": S3A_FILESYSTEM,
            "fs.s3a.impl": S3A_FILESYSTEM,
            "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
            "fs.s3a.endpoint.region": self.region or DEFAULT_REGION,
            # Delta's S3 log store checks that a commit file is absent before writing it;
            # S3A's "performance" create skips that check, and concurrent commits then
            # overwrite each other (seen against the loopback server).
            "fs.s3a.create.performance": "false",
        }
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            conf["fs.s3a.endpoint"] = self.endpoint_url
            conf["fs.s3a.path.style.access"] = "true"
            conf["fs.s3a.connection.ssl.enabled"] = str(parsed.scheme == "https").lower()
        if with_secrets and self.access_key_id:
            conf["fs.s3a.access.key"] = self.access_key_id
            conf["fs.s3a.secret.key"] = self.secret_access_key or ""
            if self.session_token:
                conf["fs.s3a.session.token"] = self.session_token
                conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            else:
                conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        return conf


def settings_from_connection(conn_id: str) -> S3Settings:
    """The settings of an Airflow connection of the `aws` type.

    With the Amazon provider installed its hook resolves the credentials (roles, profiles,
    temporary tokens); without it the connection's fields are read as that provider lays
    them out: login = access key id, password = secret access key, extra `endpoint_url`,
    `region_name`, `aws_session_token`.
    """
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        return _settings_from_fields(conn_id)
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    credentials = hook.get_credentials()
    return S3Settings(
        endpoint_url=hook.conn_config.endpoint_url, region=hook.conn_region_name,
        access_key_id=credentials.access_key, secret_access_key=credentials.secret_key,
        session_token=credentials.token,
    )


def _settings_from_fields(conn_id: str) -> S3Settings:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSecretsBackendAccessDenied

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BackfillConfigError(
            f"the job's aws_conn_id {conn_id!r} is not an Airflow connection; create it, e.g. "
            f"`airflow connections add {conn_id} --conn-type aws --conn-login ACCESS_KEY_ID "
            "--conn-password SECRET --conn-extra '{\"endpoint_url\": \"http://127.0.0.1:9000\", "
            "\"region_name\": \"us-east-1\"}'`."
        ) from None
    except AirflowSecretsBackendAccessDenied as error:
        raise AccessDeniedError(
            f"the secrets backend refused this process the job's aws_conn_id connection {conn_id!r} ({error}); "
            "allow the workers and the triggerer to read it, or name another connection."
        ) from error
    except Exception as error:
        error.add_note(f"(reading the job's aws_conn_id connection {conn_id!r})")
        raise
    extra: dict[str, Any] = connection.extra_dejson or {}
    return S3Settings(
        endpoint_url=extra.get("endpoint_url") or None,
        region=extra.get("region_name") or None,
        access_key_id=connection.login or extra.get("aws_access_key_id") or None,
        secret_access_key=connection.password or extra.get("aws_secret_access_key") or None,
        session_token=extra.get("aws_session_token") or None,
    )


_registered: dict[str, S3Settings] = {}
_registered_lock = threading.Lock()


def register_settings(uri: str, settings: S3Settings) -> None:
    """Use `settings` for every table in `uri`'s bucket in this process.

    The Airflow side (hook, sensor, trigger) registers what it read from the job's
    connection; without a registration the process's AWS_* environment applies. Keyed
    by bucket: two connections for one bucket in one process (a triggerer serving two
    jobs) share the one registered last.
    """
    with _registered_lock:
        _registered[bucket_of(uri)] = settings


def settings_for(uri: str) -> S3Settings | None:
    """The settings for `uri` (None for a local path)."""
    if not is_object_store(uri):
        return None
    with _registered_lock:
        registered = _registered.get(bucket_of(uri))
    return registered if registered is not None else S3Settings.from_environment()


def settings_origin(uri: str) -> str:
    """Where `uri`'s settings come from, as an error message names it."""
    with _registered_lock:
        registered = bucket_of(uri) in _registered
    return ("the job's aws_conn_id connection" if registered
            else "this process's AWS_* environment variables (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)")


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs `storage_options` for `uri` (None for a local path)."""
    settings = settings_for(uri)
    return None if settings is None else settings.delta_rs_options()
