"""Resident memory and CPU of process trees, sampled every second (the many_mvs section's
forward, its backfills, Airflow's processes)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any


class TreeSampler:
    """Resident memory and CPU of process trees, sampled every second.

    Resident memory is summed two ways: RSS counts the pages that forked processes share
    (Airflow's LocalExecutor workers, the API server's worker) once per process, so its sum
    overstates; PSS divides each shared page among the processes that map it, so its sum
    is the memory the tree really holds."""

    def __init__(self, roots: list[Any]) -> None:
        import psutil

        self.psutil = psutil
        self.popens = roots  # may grow while sampled (a backfill's second phase)
        self.samples: list[int] = []
        self.pss_samples: list[int] = []
        self.process_counts: list[int] = []
        self.cpu_start = self.cpu_seconds()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def processes(self) -> list[Any]:
        found = []
        for popen in list(self.popens):
            try:
                root = self.psutil.Process(popen.pid)
                found += [root, *root.children(recursive=True)]
            except self.psutil.NoSuchProcess:
                continue
        return found

    def cpu_seconds(self) -> float:
        total = 0.0
        for process in self.processes():
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except self.psutil.NoSuchProcess:
                continue
        return total

    def sample(self) -> None:
        rss = pss = count = 0
        for process in self.processes():
            try:
                memory = process.memory_full_info()
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                continue
            rss += memory.rss
            pss += getattr(memory, "pss", memory.rss)
            count += 1
        self.samples.append(rss)
        self.pss_samples.append(pss)
        self.process_counts.append(count)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def stop(self) -> dict[str, Any]:
        cpu = self.cpu_seconds() - self.cpu_start
        seconds = time.monotonic() - self.started
        self._stop.set()
        self._thread.join()
        mib = [sample / 2**20 for sample in self.samples] or [0.0]
        pss = [sample / 2**20 for sample in self.pss_samples] or [0.0]
        return {"pss_peak_mib": round(max(pss), 1), "pss_mean_mib": round(sum(pss) / len(pss), 1),
                "rss_peak_mib": round(max(mib), 1), "rss_mean_mib": round(sum(mib) / len(mib), 1),
                "processes": max(self.process_counts or [0]),
                "cpu_cores": round(cpu / seconds, 3) if seconds else None, "seconds": round(seconds, 1)}


@dataclass(frozen=True)
class Pid:
    """A process the sampler follows that this process did not start."""

    pid: int
