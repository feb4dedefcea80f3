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


def test_stop_drivers_finds_the_driver_under_a_parent_and_waits_for_it(tmp_path):
    from airflow_backfill.process import stop_drivers

    process = start_launcher(tmp_path)
    assert stop_drivers(process.pid, "forward.py", timeout=10)
    assert process.wait(timeout=5) == 0


STUCK_COMMIT = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from airflow_backfill.spark_jobs.forward import install_stop_handlers
stop = threading.Event()
install_stop_handlers(stop, grace={grace})
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)   # a commit that does not finish
"""


def test_a_commit_stuck_past_the_stop_grace_is_abandoned(tmp_path):
    root = str(Path(__file__).resolve().parents[1])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK_COMMIT.format(root=root, grace=0.5)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 10
    assert "abandoning it" in done.stderr
