"""One writer per MV on S3: a lease object taken with a conditional write.

`flock` needs one kernel; on S3 the writer lock is the object
`<target>/_airflow_backfill/writer.lease`. It is created only if absent (`If-None-Match:
*`), renewed by its holder every third of its duration while the phase runs (`If-Match`
its own ETag, so a holder that lost it notices), and taken over once expired (`If-Match`
the expired holder's ETag: of two contenders one wins). A crashed holder stops renewing,
so its lease expires instead of blocking the MV forever. A holder that could not renew
before expiry stops committing (`ensure_held`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_backfill.config import setting
from airflow_backfill.exceptions import BackfillConfigError, TargetError, WriterBusyError
from airflow_backfill.storage.failures import named_failure
from airflow_backfill.storage.s3_settings import S3Settings, settings_for
from airflow_backfill.storage.uri import bucket_of, object_key

log = logging.getLogger(__name__)

DEFAULT_DURATION_S = 60.0
"""How long a lease lasts without renewal: how long an MV stays blocked after its writer
crashed. Set with `[airflow_backfill] lease_seconds` (AIRFLOW_BACKFILL_LEASE_SECONDS)."""


def lease_duration() -> float:
    """The `lease_seconds` setting, a positive number of seconds."""
    text = setting("lease_seconds") or str(DEFAULT_DURATION_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= 86400:
        raise BackfillConfigError(f"[airflow_backfill] lease_seconds (AIRFLOW_BACKFILL_LEASE_SECONDS) must be a "
                                  f"number of seconds in (0, 86400], got {text!r}.")
    return seconds


@dataclass
class Lease:
    """A lease this process holds."""

    uri: str
    owner: str
    etag: str
    expires_at: float
    lost: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    client: Any = None
    """The S3 client that took it, and where it lies: what `confirm_held` asks."""
    bucket: str = ""
    key: str = ""


_held: dict[str, Lease] = {}
_held_lock = threading.Lock()


def s3_client(settings: S3Settings) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region or "us-east-1",
        aws_access_key_id=settings.access_key_id, aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, s3={"addressing_style": "path"}),
    )


def _precondition_failed(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict")


@contextmanager
def s3_writer_lease(lock_uri: str, target: str, job_name: str, phase: str) -> Iterator[None]:
    """Hold the lease at `lock_uri` for the block, or raise TargetError naming the holder."""
    settings = settings_for(lock_uri)
    assert settings is not None
    client = s3_client(settings)
    bucket, key = bucket_of(lock_uri), object_key(lock_uri)
    duration = lease_duration()
    owner = uuid.uuid4().hex
    holder = {"owner": owner, "phase": phase, "pid": os.getpid(), "host": socket.gethostname()}

    def body() -> bytes:
        return json.dumps({**holder, "expires_at": time.time() + duration}).encode()

    try:
        etag = client.put_object(Bucket=bucket, Key=key, Body=body(), IfNoneMatch="*")["ETag"]
    except Exception as error:
        if not _precondition_failed(error):
            failure = named_failure(error, lock_uri, "take the writer lease at")
            if failure is None:
                raise
            raise failure from error
        etag = _take_over_if_expired(client, bucket, key, body, target, job_name)
    lease = Lease(uri=target, owner=owner, etag=etag, expires_at=time.time() + duration, client=client,
                  bucket=bucket, key=key)
    renewer = threading.Thread(target=_renew, args=(client, bucket, key, lease, body, duration),
                               name="writer-lease", daemon=True)
    with _held_lock:
        _held[target] = lease
    renewer.start()
    log.info("holding the writer lease of %s for the %s phase (%.0f s, renewed while the phase runs)",
             target, phase, duration)
    try:
        yield
    finally:
        lease.stop.set()
        renewer.join(timeout=10)
        with _held_lock:
            _held.pop(target, None)
        try:
            client.delete_object(Bucket=bucket, Key=key, IfMatch=lease.etag)
        except Exception as error:  # expired and taken over, or the store is unreachable
            log.warning("could not release the writer lease of %s: %s", target, error)


def _take_over_if_expired(client: Any, bucket: str, key: str, body: Any, target: str, job_name: str) -> str:
    current = client.get_object(Bucket=bucket, Key=key)
    try:
        holder = json.loads(current["Body"].read().decode() or "{}")
    except ValueError:
        holder = {}
    expires_at = float(holder.get("expires_at") or 0)
    if expires_at > time.time():
        raise WriterBusyError(
            f"another run of job {job_name} is writing the MV {target} ({holder.get('phase')} phase, pid "
            f"{holder.get('pid')} on {holder.get('host')}, lease valid for {expires_at - time.time():.0f} s more); "
            "only one run may write an MV at a time. Wait for it to finish or stop it, then retry."
        )
    try:
        etag: str = client.put_object(Bucket=bucket, Key=key, Body=body(), IfMatch=current["ETag"])["ETag"]
    except Exception as error:
        if _precondition_failed(error):
            raise WriterBusyError(
                f"another run of job {job_name} took the expired writer lease of {target} first; only one run "
                "may write an MV at a time. Wait for it to finish or stop it, then retry."
            ) from None
        raise
    log.warning("took over the expired writer lease of %s (held by the %s phase, pid %s on %s)",
                target, holder.get("phase"), holder.get("pid"), holder.get("host"))
    return etag


def _renew(client: Any, bucket: str, key: str, lease: Lease, body: Any, duration: float) -> None:
    while not lease.stop.wait(duration / 3):
        try:
            lease.etag = client.put_object(Bucket=bucket, Key=key, Body=body(), IfMatch=lease.etag)["ETag"]
            lease.expires_at = time.time() + duration
        except Exception as error:
            if _precondition_failed(error):
                lease.lost = "another run took the lease over"
                log.error("the writer lease of %s was taken over: this run commits nothing more", lease.uri)
                return
            log.warning("could not renew the writer lease of %s (%s); retrying", lease.uri, error)
            if time.time() > lease.expires_at:
                lease.lost = f"it expired while renewals failed ({error})"
                log.error("the writer lease of %s expired: this run commits nothing more", lease.uri)
                return


def ensure_held(uri: str) -> None:
    """Raise before a commit to `uri` (or a table inside it) if this process's lease on it
    was lost; local tables and tables without a lease pass."""
    for lease in _leases_of(uri):
        if lease.lost is None and time.time() > lease.expires_at:
            lease.lost = "it expired before it could be renewed"
        if lease.lost is not None:
            raise TargetError(
                f"this run no longer holds the writer lease of {lease.uri}: {lease.lost}. It stops without "
                "committing; the MV stays at its last committed watermark. Rerun the task."
            )


CONFIRM_ATTEMPTS = 3
"""Reads of the lease `confirm_held` makes when a renewal changes its ETag meanwhile."""


def confirm_held(uri: str) -> None:
    """`ensure_held`, then ask the store: raise unless the lease object still carries this
    holder's ETag. Called at the commit point, right before a commit to `uri`, so that a
    lease taken over since the last renewal (a holder paused past its expiry, or hosts
    whose clocks disagree) stops the commit: nothing is committed. Local tables and tables
    without a lease pass without a request."""
    ensure_held(uri)
    for lease in _leases_of(uri):
        for _ in range(CONFIRM_ATTEMPTS):
            etag = lease.etag
            try:
                current = lease.client.head_object(Bucket=lease.bucket, Key=lease.key)["ETag"]
            except Exception as error:
                if getattr(error, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    lease.lost = "its object was deleted from the store"
                    break
                failure = named_failure(error, lease.uri, "confirm the writer lease of")
                raise TargetError(
                    f"could not confirm the writer lease of {lease.uri} before committing ({failure or error}). "
                    "It stops without committing; the MV stays at its last committed watermark. Rerun the task."
                ) from error
            if current == lease.etag:
                break
            if lease.etag == etag:  # not a renewal of ours in between: another run wrote it
                lease.lost = "another run took it over"
                break
        else:
            lease.lost = f"its object changed at each of {CONFIRM_ATTEMPTS} reads"
        ensure_held(uri)


def _leases_of(uri: str) -> list[Lease]:
    """The leases this process holds on `uri` or on a table that contains it."""
    with _held_lock:
        return [lease for target, lease in _held.items() if uri == target or uri.startswith(target.rstrip("/") + "/")]
