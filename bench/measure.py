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
    """Peak resident memory of a process and all its descendants (the JVM included).

    Two peaks are kept: one since `reset()` (a section) and one since the innermost
    `window()` (one measured call inside the section, such as a catch-up run without
    the upstream writes that prepared it).
    """

    def __init__(self, pid: int | None = None, interval: float = 0.1) -> None:
        self._pid = pid or os.getpid()
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._section = [0, 0, 0]  # [whole tree, largest JVM, the root process] in bytes
        self._window = [0, 0, 0]
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
        """Start a new section peak (for the next section run by the same process)."""
        with self._lock:
            self._section = [0, 0, 0]
            self._window = [0, 0, 0]
        self.sample()

    @contextmanager
    def window(self) -> Iterator[dict[str, float | None]]:
        """`with sampler.window() as peak:` fills `peak` with the block's peaks on exit, and
        the root process's RSS when the block began (so its growth can be told apart from
        what the process already held)."""
        with self._lock:
            self._window = [0, 0, 0]
        self.sample()
        with self._lock:
            start_root = self._window[2]
        peaks: dict[str, float | None] = {}
        try:
            yield peaks
        finally:
            self.sample()
            with self._lock:
                peaks.update(self._as_mib(self._window))
            if self.available:
                peaks["start_root_rss_mib"] = round(start_root / MIB, 1)

    def peaks_mib(self) -> dict[str, float | None]:
        """Peak RSS since `reset()`, in MiB: the whole tree, its largest JVM, the root process.

        The tree's figure sums RSS, so pages shared by forked processes (PySpark's Python
        workers) count more than once: it is an upper bound.
        """
        self.sample()
        with self._lock:
            return self._as_mib(self._section)

    def _as_mib(self, peaks: list[int]) -> dict[str, float | None]:
        names = ("peak_rss_mib", "peak_jvm_rss_mib", "peak_root_rss_mib")
        if not self.available:
            return dict.fromkeys(names)
        return {name: round(peak / MIB, 1) for name, peak in zip(names, peaks, strict=True)}

    def sample(self) -> None:
        psutil = _psutil()
        if psutil is None:
            return
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = jvm = root_rss = 0
        for process in processes:
            try:
                rss = process.memory_info().rss
                name = process.name()
            except psutil.Error:
                continue
            total += rss
            if process.pid == self._pid:
                root_rss = rss
            if name == "java":
                jvm = max(jvm, rss)
        with self._lock:
            for peaks in (self._section, self._window):
                peaks[0] = max(peaks[0], total)
                peaks[1] = max(peaks[1], jvm)
                peaks[2] = max(peaks[2], root_rss)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def without_cached_states(spark: Any) -> None:
    """Drop the table states Delta keeps in the JVM, so a measured side reads the tables as
    a process of its own would (each DAG task, and a user's recompute, is one): the first
    reader of a new version rebuilds its state (0.3 - 0.6 s a table at SF 1), and a side
    measured after another at the same version would reuse that one's."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


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
