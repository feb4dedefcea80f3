"""stop_driver signals the Python driver under a launcher, not the launcher itself."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from airflow_backfill.process import python_drivers, stop_driver

DRIVER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("driver: finishing the commit", flush=True), sys.exit(0)))
print("driver: running", flush=True)
while True:
    time.sleep(0.1)
"""
# Like spark-submit's JVM: waits for its child and ignores SIGTERM forwarding.
LAUNCHER = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(subprocess.call([sys.executable, sys.argv[1]]))
"""


def start_launcher(tmp_path: Path) -> subprocess.Popen:
    driver = tmp_path / "forward.py"
    driver.write_text(DRIVER)
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    process = subprocess.Popen([sys.executable, str(launcher), str(driver)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "driver: running"
    return process


def test_the_driver_gets_sigterm_and_the_launcher_exits_with_its_code(tmp_path):
    process = start_launcher(tmp_path)
    assert len(python_drivers(process.pid, "forward.py")) == 1
    assert stop_driver(process.pid, "forward.py", timeout=10)
    assert process.wait(timeout=5) == 0
    assert process.stdout is not None and "finishing the commit" in process.stdout.read()


def test_no_matching_driver_times_out(tmp_path):
    process = start_launcher(tmp_path)
    try:
        started = time.monotonic()
        assert stop_driver(process.pid, "snapshot.py", timeout=0.5) is False
        assert time.monotonic() - started >= 0.5
        assert process.poll() is None
    finally:
        drivers = python_drivers(process.pid, "forward.py")
        process.kill()
        for child in drivers:
            child.kill()
        process.wait()


def test_a_gone_process_counts_as_stopped():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    assert stop_driver(finished.pid, "forward.py", timeout=1)
