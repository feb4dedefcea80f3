"""What a failed read of a table's store was: the store unreachable, the credentials
refused, or a local path this process may not read.

delta-rs, pyarrow's S3 file system and boto3 each report these in their own words:
delta-rs as an OSError whose text carries the HTTP status and the store's error code
(`403 Forbidden ... InvalidAccessKeyId`, `tcp connect error ... Connection refused`),
pyarrow as `AWS Error ACCESS_DENIED` or `NETWORK_CONNECTION`, boto3 as typed exceptions,
and the operating system as a PermissionError. `named_failure` turns each into an error
that says what happened, where, and the fix, quoting the original (secrets masked);
anything else (a missing version, a damaged log) is not its business and is left as it
was, so that the caller can say what that means.
"""

from __future__ import annotations

import functools
import getpass
import re
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from airflow_backfill.exceptions import AccessDeniedError, ServiceError, UnreachableError
from airflow_backfill.storage.s3_settings import settings_for, settings_origin
from airflow_backfill.storage.uri import is_object_store

P = ParamSpec("P")
R = TypeVar("R")

_REFUSED_CREDENTIALS = (
    (("invalidaccesskeyid", "invalid_access_key_id"), "it does not know the access key id"),
    (("signaturedoesnotmatch", "signature_does_not_match"), "the secret access key does not match the access key id"),
    (("expiredtoken", "expired_token", "tokenrefreshrequired"), "the session token has expired"),
    (("invalidtoken", "invalid_token"), "the session token is not valid"),
)
"""The store's error codes (S3's own spelling, then pyarrow's) that say the credentials
themselves are wrong, with what each means."""
_DENIED = ("accessdenied", "access_denied", "403 forbidden", "lacked the necessary privileges", "(403)")
"""Refusals that do not say why: wrong credentials, or right ones without the permission
(a HEAD request's 403 has no body to tell them apart)."""
_NO_CREDENTIALS = ("unable to locate credentials", "nocredentialserror", "missing credentials")
_UNREACHABLE = (
    ("connection refused", "the connection was refused (nothing listens at that address and port)"),
    ("connect error", "the connection could not be made"),
    ("could not connect", "the connection could not be made"),
    ("dns error", "the host name does not resolve"),
    ("failed to lookup address", "the host name does not resolve"),
    ("name or service not known", "the host name does not resolve"),
    ("could not resolve host", "the host name does not resolve"),
    ("timed out", "it did not answer in time"),
    ("connection reset", "the connection was cut"),
    ("error sending request", "the request could not be sent"),
    ("network_connection", "the connection could not be made"),
    ("endpointconnectionerror", "the connection could not be made"),
    ("connecttimeouterror", "it did not answer in time"),
    ("readtimeouterror", "it did not answer in time"),
)
"""Network failures (delta-rs' and pyarrow's words, boto3's exception names), and what
each says happened."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
QUOTED_CHARS = 600
"""How much of the original error a message quotes (delta-rs' can run to pages)."""


def named_failure(error: BaseException, uri: str, action: str = "read") -> ServiceError | None:
    """The error that names why `action` (read, write, ...) of `uri` failed with `error`
    when it is a network failure, refused credentials or a denied local path; None else."""
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    if not is_object_store(uri):
        if isinstance(error, PermissionError) or "permission denied" in lowered or "os error 13" in lowered:
            return AccessDeniedError(
                f"this process (user {_user()}) may not {action} {uri}: the operating system denied it. Give "
                "the user that runs the task access to that folder (read for an upstream, read and write for "
                f"an MV), or run the task as its owner. ({_quote(text, uri)})"
            )
        return None
    settings = settings_for(uri)
    store = (settings.endpoint_url if settings is not None else None) or "S3"
    origin = settings_origin(uri)
    quoted = _quote(text, uri)
    for codes, meaning in _REFUSED_CREDENTIALS:
        if any(code in lowered for code in codes):
            return AccessDeniedError(
                f"{store} refused the credentials to {action} {uri}: {meaning}. Fix the access key id, secret "
                f"access key or session token of {origin}. ({quoted})"
            )
    if any(marker in lowered for marker in _NO_CREDENTIALS):
        return AccessDeniedError(
            f"no credentials to {action} {uri} on {store}: set them in {origin}. ({quoted})"
        )
    if any(marker in lowered for marker in _DENIED):
        return AccessDeniedError(
            f"{store} refused to let this process {action} {uri} (403 Forbidden): the credentials of {origin} "
            "are wrong or expired, or their policy does not allow it (listing and reading the bucket, and "
            f"writing for an MV). ({quoted})"
        )
    happened = next((said for marker, said in _UNREACHABLE if marker in lowered), None)
    if happened is None and isinstance(error, (ConnectionError, TimeoutError)):
        happened = "the connection failed"
    if happened is not None:
        return UnreachableError(
            f"cannot reach {store} to {action} {uri}: {happened}. Check the endpoint of {origin} and that the "
            f"store is up and reachable from this host; retry once it is. ({quoted})"
        )
    return None


def names_failures(action: str = "read") -> Callable[[Callable[Concatenate[str, P], R]], Callable[Concatenate[str, P], R]]:
    """Decorate a function whose first argument is a table's URI: a failure that
    `named_failure` recognises is raised as its named error, chained to the original. A
    failure an inner call already named (one file of the table) is named again by this
    call's URI and action: the outermost call says what the person asked for."""
    def decorate(function: Callable[Concatenate[str, P], R]) -> Callable[Concatenate[str, P], R]:
        @functools.wraps(function)
        def named(uri: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return function(uri, *args, **kwargs)
            except ServiceError as error:
                cause = error.__cause__
                renamed = named_failure(cause, uri, action) if cause is not None else None
                if renamed is None:
                    raise
                raise renamed from cause
            except Exception as error:
                failure = named_failure(error, uri, action)
                if failure is None:
                    raise
                raise failure from error
        return named
    return decorate


def _quote(text: str, uri: str) -> str:
    """The original error on one line, without terminal colours, secrets masked, cut short."""
    text = " ".join(_ANSI.sub("", text).replace("\u21b3", " ").split())
    settings = settings_for(uri)
    for secret in settings.secrets() if settings is not None else ():
        text = text.replace(secret, "***")
    return text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + " ..."


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        import os

        return str(os.getuid())
