"""Turn the benchmark's JSON into the table `bench/run.py` prints (and docs/benchmarks.md shows)."""

from __future__ import annotations

from typing import Any

SNAPSHOT_OVERHEAD_TARGET = 1.3
"""Engine snapshot / plain Spark job (stateless MV, key proof on)."""
CATCH_UP_1PCT_TARGET = 5.0
"""1 % scattered updates caught up at least this many times faster than a recompute."""
DRIVER_MEMORY_GROWTH_TARGET = 1.25
"""Driver Python peak of a 10 % catch-up over that of a 1 % one."""
REFRESH_TARGETS = {"stateless": 20.0, "aggregate": 11.0}
"""One RF1 + RF2 pair caught up at least this many times faster than a recompute."""
FRESHNESS_MEDIAN_TARGET = 2.5
FRESHNESS_P95_TARGET = 4.0


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{unit}"
    return f"{value}{unit}"


def _ceiling(recompute_s: float, floor_s: float | None) -> str:
    """How fast any round could be at best: the recompute over the round's floor (the feed
    read, locating the keys, the commits; bench/sections.py `round_floor`)."""
    if not floor_s:
        return ""
    return f"; floor {floor_s:.2f} s, so at most {recompute_s / floor_s:.1f}x"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: ""}[met]


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measurement, figure, target, verdict) rows, one per headline figure."""
    table: list[tuple[str, str, str, str]] = []
    overhead = result.get("snapshot_overhead", {})
    for kind in ("stateless", "aggregate", "stateless_unverified_key"):
        case = overhead.get(kind, {})
        label = "stateless MV, verify_primary_key false" if kind == "stateless_unverified_key" else f"{kind} MV"
        if kind == "stateless_unverified_key" and kind not in overhead:
            continue
        if case.get("status") == "measured":
            table.append((
                f"1. snapshot overhead, {label} (p{overhead.get('parallelism')})",
                f"{_fmt(case['ratio'])}x ({_fmt(case['engine_median_s'], ' s')} vs {_fmt(case['plain_median_s'], ' s')})",
                f"<= {SNAPSHOT_OVERHEAD_TARGET}", _verdict(case["ratio"] <= SNAPSHOT_OVERHEAD_TARGET),
            ))
        else:
            table.append((f"1. snapshot overhead, {label}", _short(case.get("status", overhead.get("status"))), "", ""))
    scaling = result.get("scaling", {})
    if "speedup" in scaling:
        table.append((
            "2. snapshot scaling p1 -> p2",
            f"{_fmt(scaling['speedup'])}x ({_fmt(scaling['p1_median_s'], ' s')} -> {_fmt(scaling['p2_median_s'], ' s')}; "
            f"plain Spark {_fmt(scaling.get('plain_speedup'))}x)",
            ">= 1.6", _verdict(scaling["speedup"] >= 1.6),
        ))
    else:
        table.append(("2. snapshot scaling p1 -> p2", _short(scaling.get("status")), "", ""))
    catch_up = result.get("catch_up", {})
    shares = catch_up.get("shares", {})
    for share, case in shares.items():
        speedup = case["recompute_s"] / case["catch_up_s"] if case.get("catch_up_s") else None
        target = CATCH_UP_1PCT_TARGET if float(share) == 0.01 else None
        table.append((
            f"3. catch-up of {float(share):.1%} updated rows vs recompute",
            f"{_fmt(speedup)}x faster ({_fmt(case['catch_up_s'], ' s')} vs {_fmt(case['recompute_s'], ' s')}"
            f"{_ceiling(case['recompute_s'], case.get('floor_s', {}).get('total'))})",
            f">= {target}x" if target else "", _verdict(speedup >= target) if target and speedup else "",
        ))
    newest = catch_up.get("newest", {})
    if newest.get("catch_up_s"):
        table.append((
            f"3. catch-up of {float(newest['share']):.1%} updated rows of the newest orders vs recompute",
            f"{_fmt(newest['recompute_s'] / newest['catch_up_s'])}x faster ({_fmt(newest['catch_up_s'], ' s')} vs "
            f"{_fmt(newest['recompute_s'], ' s')}; MV of {catch_up.get('mv_files')} files"
            f"{_ceiling(newest['recompute_s'], newest.get('floor_s', {}).get('total'))})", "", "",
        ))
    ten, one = shares.get("0.1", {}), shares.get("0.01", {})
    if ten.get("driver_python_peak_mib") and one.get("driver_python_peak_mib"):
        growth = ten["driver_python_peak_mib"] / one["driver_python_peak_mib"]
        start = one.get("driver_python_start_mib")
        held = f"; {start:.0f} MiB before the 1 % catch-up" if start else ""
        table.append((
            "3. driver Python peak, catch-up of 10 % vs 1 %",
            f"{growth:.2f}x ({ten['driver_python_peak_mib']:.0f} MiB vs {one['driver_python_peak_mib']:.0f} MiB{held})",
            f"<= {DRIVER_MEMORY_GROWTH_TARGET}x", _verdict(growth <= DRIVER_MEMORY_GROWTH_TARGET),
        ))
    if ten.get("jvm_peak_mib") and one.get("jvm_peak_mib"):
        table.append((
            "3. Spark JVM peak (driver and executors in local mode), catch-up of 10 % vs 1 %",
            f"{ten['jvm_peak_mib'] / one['jvm_peak_mib']:.2f}x ({ten['jvm_peak_mib']:.0f} MiB vs "
            f"{one['jvm_peak_mib']:.0f} MiB)", "", "",
        ))
    if not shares:
        table.append(("3. catch-up vs recompute", _short(catch_up.get("status")), "", ""))
    refresh = result.get("refresh", {})
    for kind, label in (("stateless", "stateless MV"), ("aggregate", "Q1 aggregate")):
        case = refresh.get(kind, {})
        if "speedup" in case:
            table.append((
                f"3. {label}: RF1+RF2 catch-up vs recompute (p{refresh['parallelism']})",
                f"{_fmt(case['speedup'])}x faster ({_fmt(case['catch_up_median_s'], ' s')} vs "
                f"{_fmt(case['recompute_median_s'], ' s')}{_ceiling(case['recompute_median_s'], case.get('floor_median_s'))})",
                f">= {REFRESH_TARGETS[kind]:.0f}x", _verdict(case["speedup"] >= REFRESH_TARGETS[kind]),
            ))
        else:
            table.append((f"3. {label}: RF1+RF2 catch-up vs recompute", _short(refresh.get("status")), "", ""))
    freshness = result.get("freshness", {})
    if "median_s" in freshness:
        table.append((
            f"4. forward freshness (p{freshness['parallelism']}, {freshness['epochs_reflected']} epochs)",
            f"median {_fmt(freshness['median_s'], ' s')}, p95 {_fmt(freshness['p95_s'], ' s')}",
            f"median <= {FRESHNESS_MEDIAN_TARGET} s, p95 <= {FRESHNESS_P95_TARGET} s",
            _verdict(freshness["median_s"] <= FRESHNESS_MEDIAN_TARGET and freshness["p95_s"] <= FRESHNESS_P95_TARGET),
        ))
    else:
        table.append(("4. forward freshness", _short(freshness.get("status")), "", ""))
    orchestration = result.get("orchestration", {})
    if "wall_s" in orchestration:
        table.append((
            "5. airflow dags test vs phases' Spark time",
            f"{_fmt(orchestration['wall_s'], ' s')} vs {_fmt(orchestration['spark_s'], ' s')} "
            f"(+{_fmt(orchestration['overhead_s'], ' s')})",
            "", "",
        ))
    else:
        table.append(("5. orchestration overhead", _short(orchestration.get("status")), "", ""))
    for kind in ("stateless", "aggregate"):
        case = overhead.get(kind, {})
        if case.get("engine_peak_rss_mib") is not None:
            table.append((f"6. peak memory, {kind} snapshot: engine vs plain",
                          f"{case['engine_peak_rss_mib']:.0f} MiB vs {case['plain_peak_rss_mib']:.0f} MiB", "", ""))
    for section, memory in result.get("memory", {}).items():
        table.append((f"6. peak memory, {section}", _memory(memory), "", ""))
    return table


def _memory(memory: dict[str, Any]) -> str:
    if memory.get("peak_rss_mib") is None:
        return "not measured (psutil missing)"
    root = memory.get("peak_root_rss_mib")
    driver = f", Python {root:.0f} MiB" if root is not None else ""
    return f"{memory['peak_rss_mib']:.0f} MiB (JVM {memory['peak_jvm_rss_mib']:.0f} MiB{driver})"


def _short(status: Any, limit: int = 90) -> str:
    text = str(status or "not run")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render(result: dict[str, Any]) -> str:
    """A plain-text table with the run's scale and machine load in its title."""
    meta = result.get("meta", {})
    title = (
        f"TPC-H lineitem, scale factor {meta.get('scale_factor')}"
        f"{' (--quick)' if meta.get('quick') else ''}, {meta.get('cpus')} CPUs, "
        f"load {meta.get('load_before')} before / {meta.get('load_after')} after, {_fmt(meta.get('seconds'), ' s')}"
    )
    body = rows(result)
    headers = ("measurement", "figure", "target", "")
    widths = [max(len(headers[i]), *(len(row[i]) for row in body)) for i in range(4)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    """The same table in Markdown, for docs/benchmarks.md."""
    lines = ["| measurement | figure | target | |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows(result)]
    return "\n".join(lines)
