"""An S3-compatible server on 127.0.0.1 for the tests (moto's standalone server), one per
test session, and a fresh bucket per test."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from airflow_processes import free_port

from airflow_backfill.storage.s3_settings import S3Settings

START_TIMEOUT_S = 60


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    access_key_id: str
    secret_access_key: str

    def settings(self) -> S3Settings:
        return S3Settings(endpoint_url=self.endpoint_url, region="us-east-1",
                          access_key_id=self.access_key_id, secret_access_key=self.secret_access_key)

    def new_bucket(self) -> str:
        """A new empty bucket's name."""
        from airflow_backfill.storage.lease import s3_client

        name = f"lake-{uuid.uuid4().hex[:12]}"
        s3_client(self.settings()).create_bucket(Bucket=name)
        return name

    def connection_json(self) -> str:
        """The server as an Airflow `aws` connection (AIRFLOW_CONN_<ID> in JSON)."""
        import json

        return json.dumps({"conn_type": "aws", "login": self.access_key_id, "password": self.secret_access_key,
                           "extra": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"}})


@contextmanager
def s3_server(workdir: Path) -> Iterator[S3Server]:
    """moto's server on a free loopback port; stopped (and waited for) on exit."""
    port = free_port()
    binary = Path(sys.executable).with_name("moto_server")
    log = open(workdir / "moto.log", "wb")  # noqa: SIM115 - the server's lifetime
    process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, (workdir / "moto.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/moto-api/", timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the S3 server did not answer on {url} within {START_TIMEOUT_S} s"
            time.sleep(0.2)
        # A secret that no other text of the test run contains by chance.
        yield S3Server(endpoint_url=url, access_key_id="test-key-" + secrets.token_hex(4),
                       secret_access_key="s3cret-" + secrets.token_hex(16))
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        log.close()
