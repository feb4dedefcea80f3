"""An S3-compatible server on 127.0.0.1 (moto's standalone server, from the `test` extra)
for the tests and the object-store benchmark: nothing leaves the machine."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from airflow_backfill.loopback import free_port
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
def loopback_s3(workdir: Path) -> Iterator[S3Server]:
    """moto's server on a free loopback port; stopped (and waited for) on exit."""
    port = free_port()
    binary = Path(sys.executable).with_name("moto_server")
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is missing: install the test extra (pip install -e '.[test]').")
    log = open(workdir / "moto.log", "wb")  # noqa: SIM115 - the server's lifetime
    process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError("the S3 server exited: " + (workdir / "moto.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not answer on {url} within {START_TIMEOUT_S} s")
            time.sleep(0.2)
        # A secret that no other text of a test run contains by chance.
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
