"""Timing, statistics and peak-memory sampling shared by the benchmark sections.

Memory is sampled rather than read from `getrusage`: in local mode the Spark driver is
a JVM that the Python process starts as its child and never waits for, so only sampling
the process tree sees it. psutil comes with Airflow; without it, memory is reported as
not measured instead of failing the benchmark.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

MIB = 1024 * 1024


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (share in (0, 1]): an observed value, never interpolated."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return float(ordered[rank - 1])


class MemorySampler:
    """Peak resident memory of a process and all its descendants (the JVM included)."""

    def __init__(self, pid: int | None = None, interval: float = 0.1) -> None:
        self._pid = pid or os.getpid()
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._peak_total = 0
        self._peak_jvm = 0
        self.available = _psutil() is not None

    def __enter__(self) -> MemorySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if not self.available:
            return
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def reset(self) -> None:
        """Start a new peak (for the next section run by the same process)."""
        with self._lock:
            self._peak_total = self._peak_jvm = 0
        self.sample()

    def peaks_mib(self) -> dict[str, float | None]:
        """Peak RSS of the whole tree and of the largest JVM in it, in MiB."""
        if not self.available:
            return {"peak_rss_mib": None, "peak_jvm_rss_mib": None}
        self.sample()
        with self._lock:
            return {
                "peak_rss_mib": round(self._peak_total / MIB, 1),
                "peak_jvm_rss_mib": round(self._peak_jvm / MIB, 1),
            }

    def sample(self) -> None:
        psutil = _psutil()
        if psutil is None:
            return
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = jvm = 0
        for process in processes:
            try:
                rss = process.memory_info().rss
                name = process.name()
            except psutil.Error:
                continue
            total += rss
            if name == "java":
                jvm = max(jvm, rss)
        with self._lock:
            self._peak_total = max(self._peak_total, total)
            self._peak_jvm = max(self._peak_jvm, jvm)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """`with stopwatch() as elapsed:` ... `elapsed()` seconds (frozen once the block ends)."""
    started = time.perf_counter()
    ended: list[float] = []
    yield lambda: (ended[0] if ended else time.perf_counter()) - started
    ended.append(time.perf_counter())


class PhaseTimer:
    """Seconds spent in named functions, accumulated while a call is wrapped.

    Used to break the engine's snapshot time down into its steps without changing the
    engine: the module attribute is replaced by a timing wrapper for the duration.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def wrapping(self, module: Any, names: Sequence[str]) -> Iterator[PhaseTimer]:
        originals = {name: getattr(module, name) for name in names if hasattr(module, name)}
        for name, original in originals.items():
            setattr(module, name, self._timed(name, original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(module, name, original)

    def take(self) -> dict[str, float]:
        """The accumulated seconds (rounded), then start again from zero."""
        taken = {name: round(value, 3) for name, value in self.seconds.items()}
        self.seconds = {}
        return taken

    def _timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

        return timed
