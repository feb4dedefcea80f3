"""Stop a phase gracefully through `spark-submit`.

In client mode spark-submit is a JVM that runs the phase's Python driver as its child
and does not pass signals on: SIGTERM or SIGKILL to the JVM leaves the driver to die on
its next Spark call. Signalling the Python driver itself lets forward finish its current
commit and exit 0, after which spark-submit exits 0 too.
"""

from __future__ import annotations

import signal

import psutil


def python_drivers(pid: int, script: str) -> list[psutil.Process]:
    """Descendants of `pid` that run the entry point `script` (e.g. 'forward.py')."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    drivers = []
    for child in children:
        try:
            if any(part.endswith(script) for part in child.cmdline()):
                drivers.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return drivers


def stop_driver(pid: int, script: str, timeout: float) -> bool:
    """SIGTERM the Python driver(s) under `pid` and wait; True when `pid` exited in time."""
    for driver in python_drivers(pid, script):
        try:
            driver.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    try:
        psutil.Process(pid).wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def stop_drivers(parent_pid: int, script: str, timeout: float) -> bool:
    """SIGTERM the Python driver(s) under `parent_pid` and wait for them; True when all
    exited within `timeout` seconds (also when there was none)."""
    drivers = python_drivers(parent_pid, script)
    for driver in drivers:
        try:
            driver.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(drivers, timeout=timeout)
    return not alive
