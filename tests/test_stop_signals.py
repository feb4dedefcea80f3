"""A stop signal must reach the loop whatever the main thread was doing when it came."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from airflow_backfill.stop_signals import request_stop_on


@pytest.mark.timeout(30)
def test_a_signal_while_the_loop_holds_the_events_lock_still_stops_it():
    stop = threading.Event()
    announced: list[int] = []
    previous = request_stop_on(stop, [signal.SIGUSR1], on_request=announced.append)
    try:
        with stop._cond:  # where `stop.wait()` is when a signal lands between its steps
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.2)  # the handler runs here, in this thread, with the lock held
            assert not stop.is_set()
        assert stop.wait(10), "the stop request never arrived"
        assert announced == [signal.SIGUSR1]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
