"""Turn the benchmark's JSON into the table `bench/run.py` prints (and docs/benchmarks.md shows)."""

from __future__ import annotations

from typing import Any

SNAPSHOT_OVERHEAD_TARGET = 1.3
"""Engine snapshot / plain Spark job (stateless MV, key proof on)."""
NEVER_SLOWER_TARGET = 1.0
"""Every catch-up case at least as fast as the plain Spark recompute it is compared with."""
CATCH_UP_1PCT_TARGET = 1.0
"""1 % scattered updates caught up at least this many times faster than a plain recompute."""
ONE_ROW_TARGET_S = 0.5
"""A round of one updated line item (scale factor 1) takes at most this long."""
DRIVER_MEMORY_GROWTH_TARGET = 1.25
"""Driver Python peak of a 10 % catch-up over that of a 1 % one."""
REFRESH_TARGETS = {1.0: {"stateless": 1.5, "aggregate": 3.0}, 10.0: {"stateless": 4.0, "aggregate": 15.0}}
"""Per scale factor: one RF1 + RF2 pair caught up at least this many times faster than a plain recompute."""
SUBMIT_TARGETS = {"stateless": 1.2, "aggregate": 1.5}
"""Catch-up as its own spark-submit (cold JVM) at least this many times faster than a plain
recompute submitted the same way, one RF1 + RF2 pair at scale factor 1."""
FRESHNESS_MEDIAN_TARGET = 1.5
FRESHNESS_P95_TARGET = 3.0


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
    table += _catch_up_rows(result)
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
    table += _many_mvs_rows(result.get("many_mvs"))
    return table


MANY_MVS_MEDIAN_TARGET = 3.0
MANY_MVS_P95_TARGET = 10.0
MANY_MVS_RSS_TARGET_GIB = 12.0


def _many_mvs_rows(section: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """The many_mvs section (bench/many_mvs.py): freshness and memory against the targets,
    the rounds, key checks, rewrites, feeds along the chains, exactness and the JVM."""
    if section is None:
        return []
    if section.get("status") != "measured":
        return [("10. many MVs", _short(section.get("status")), "", "")]
    mvs = f"10. {section['mvs']} MVs ({section.get('writers')}' writers, {section.get('rows')} rows an upstream)"
    table = _many_mvs_freshness(section, mvs)
    for window, label in (("steady", ""), ("with_backfill", ", a new MV backfilling")):
        total = section.get(f"platform_{window}_pss_peak_gib")
        measured = section.get(window) or {}
        table.append((f"{mvs} resident memory (PSS), every process{label}",
                      f"{_fmt(total, ' GiB')} (forward{' and backfill' if label else ''} "
                      f"{_fmt(measured.get('pss_peak_mib'), ' MiB')}, Airflow and PostgreSQL "
                      f"{_fmt(section.get('airflow', {}).get('pss_peak_mib'), ' MiB')}; RSS summed "
                      f"{_fmt(section.get(f'platform_{window}_rss_peak_gib'), ' GiB')})",
                      f"<= {MANY_MVS_RSS_TARGET_GIB} GiB",
                      _verdict(None if total is None else total <= MANY_MVS_RSS_TARGET_GIB)))
    table += _many_mvs_rounds(section, mvs)
    single = section.get("single_mv_forward", {})
    if "idle_rss_mib" in single:
        table.append(("10. alternative: a forward task per MV",
                      f"{_fmt(single['idle_rss_mib'], ' MiB')} each idle, {_fmt(single['projected_rss_gib_for_all'], ' GiB')} "
                      f"for {section['mvs']}; a run per commit {_fmt(single['per_commit_run_s'], ' s')} launch to commit",
                      "", ""))
    exact = section.get("exact", {})
    last, every = exact.get("last_watermark", {}), exact.get("every_version", {})
    if "checked" in last:
        versions = f"; {every['exact']} of {every['checked']} versions in the window" if every.get("checked") else ""
        table.append((f"{mvs} exact", f"{last['exact']} of {last['checked']} at the last watermark{versions}", "all",
                       _verdict(last["exact"] == last["checked"] and every.get("exact") == every.get("checked"))))
    else:
        table.append((f"{mvs} exact", _short(exact.get("status")), "", ""))
    return table


def _many_mvs_freshness(section: dict[str, Any], mvs: str) -> list[tuple[str, str, str, str]]:
    table = []
    steady = section["steady"]
    for label, window in (("", steady), (", a new MV backfilling", section.get("with_backfill"))):
        fresh = (window or {}).get("freshness", {})
        if "median_s" not in fresh:
            if window is not None:
                table.append((f"{mvs} freshness{label}", _short(fresh.get("status")), "", ""))
            continue
        met = fresh["median_s"] <= MANY_MVS_MEDIAN_TARGET and fresh["p95_s"] <= MANY_MVS_P95_TARGET
        target = f"median <= {MANY_MVS_MEDIAN_TARGET} s, p95 <= {MANY_MVS_P95_TARGET} s"
        if window is not steady and "median_s" in steady.get("freshness", {}):
            met = fresh["p95_s"] <= 2 * steady["freshness"]["p95_s"]
            target = "p95 <= 2x without"
        table.append((f"{mvs} freshness{label}",
                      f"median {_fmt(fresh['median_s'], ' s')}, p95 {_fmt(fresh['p95_s'], ' s')}, max "
                      f"{_fmt(fresh['max_s'], ' s')} ({fresh['samples']} samples, "
                      f"{fresh['not_reflected_counted_as_lower_bound']} not reflected); CPU "
                      f"{_fmt((window or {}).get('cpu_cores'))} cores", target, _verdict(met)))
        for kind, found in fresh.get("kinds", {}).items():
            table.append((f"{mvs} freshness{label}, {kind}",
                          f"median {_fmt(found['median_s'], ' s')}, p95 {_fmt(found['p95_s'], ' s')}, max "
                          f"{_fmt(found['max_s'], ' s')}", "", ""))
    exited = section.get("forward_exit") or {}
    if exited.get("exited_by_itself"):
        table.append((f"{mvs} the shared forward", f"exited by itself (code {exited['code']}) after "
                      f"{_fmt(exited['after_s'], ' s')}", "runs for ever", "MISSED"))
    return table


def _many_mvs_rounds(section: dict[str, Any], mvs: str) -> list[tuple[str, str, str, str]]:
    """Rounds, key checks and whole-MV rewrites over the forward's whole run (the window's
    for runs that kept no more)."""
    table = []
    whole = section.get("whole_run") or section
    for kind, found in (whole.get("logged_rounds") or {}).items():
        if isinstance(found, dict) and "median_s" in found:
            plans = ", ".join(f"{plan} {count}" for plan, count in found["plans"].items())
            table.append((f"{mvs} rounds, {kind}", f"{found['count']} rounds, median {_fmt(found['median_s'], ' s')}, "
                          f"p90 {_fmt(found['p90_s'], ' s')} ({plans})", "", ""))
    checks = (whole.get("key_checks") or {}).get("all", {})
    for how in ("upstream_read", "driver_lookup", "no_upstream_read"):
        found = checks.get(how, {})
        if found.get("count"):
            table.append((f"{mvs} key checks, {how.replace('_', ' ')}", f"{found['count']} checks, median "
                          f"{_fmt(found['median_s'], ' s')}, p90 {_fmt(found['p90_s'], ' s')}, total "
                          f"{_fmt(found['total_s'], ' s')}", "", ""))
    writes = whole.get("writes") or {}
    if "rounds" in writes:
        table.append((f"{mvs} rounds that rewrote a whole MV", f"{writes['whole_mv_rewrites']} of {writes['rounds']}",
                      "", ""))
    for link in (section.get("chain_feeds") or {}).get("links", []):
        if link.get("feed_rows_per_changed_row") is not None:
            table.append((f"{mvs} feed rows per changed row, {link['source']} -> {link['reader']}",
                          f"{_fmt(link['feed_rows_per_changed_row'])} ({link['feed_rows']} rows, "
                          f"{link['changed_rows']} changed, {link['versions']} versions)", "<= 2", ""))
    cache = section.get("code_cache") or {}
    if "full" in cache:
        at = cache.get("at_jvm_uptime_s")
        when = f" at {at:.0f} s of the JVM" if at else ""
        table.append((f"{mvs} JVM code cache full", f"{'yes' if cache['full'] else 'no'}{when}", "no",
                      _verdict(not cache["full"])))
    for kind, found in (section.get("plain_recompute") or {}).items():
        if isinstance(found, dict) and "submit_s" in found:
            table.append((f"{mvs} plain Spark recompute, {kind} ({found['mv']})",
                          f"{_fmt(found['submit_s'], ' s')} as a spark-submit, "
                          f"{_fmt(found['read_query_write_s'], ' s')} read, query and write", "", ""))
    return table


def _case(label: str, case: dict[str, Any], target: float | None) -> tuple[str, str, str, str]:
    """One catch-up case against the plain recompute (the target) and the engine's snapshot."""
    speedup = case.get("speedup")
    plans = ", ".join(dict.fromkeys(case.get("plans") or [])) or "-"
    figure = (f"{_fmt(speedup)}x ({_fmt(case.get('catch_up_s'), ' s')} vs plain {_fmt(case.get('plain_s'), ' s')}; "
              f"vs snapshot {_fmt(case.get('speedup_vs_snapshot'))}x; plan {plans}"
              f"{_ceiling(case.get('plain_s') or 0.0, (case.get('floor_s') or {}).get('total'))})")
    wanted = max(target or 0.0, NEVER_SLOWER_TARGET)
    return label, figure, f">= {wanted}x", _verdict(speedup >= wanted) if speedup else ""


def _catch_up_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Section 3: every catch-up case against a plain recompute at the same version."""
    table: list[tuple[str, str, str, str]] = []
    scale = float(result.get("meta", {}).get("scale_factor") or 0)
    catch_up = result.get("catch_up", {})
    shares = catch_up.get("shares", {})
    for share, case in shares.items():
        target = CATCH_UP_1PCT_TARGET if float(share) == 0.01 else None
        table.append(_case(f"3. catch-up of {float(share):.1%} updated rows", case, target))
    newest = catch_up.get("newest", {})
    if newest.get("catch_up_s"):
        table.append(_case(f"3. catch-up of {float(newest['share']):.1%} updated rows of the newest orders",
                           newest, None))
    one_row = catch_up.get("one_row", {})
    if one_row.get("catch_up_s"):
        label, figure, _, _ = _case("3. catch-up of one updated row", one_row, None)
        bound = scale == 1.0
        met = one_row["catch_up_s"] <= ONE_ROW_TARGET_S and one_row.get("speedup", 0) >= NEVER_SLOWER_TARGET
        table.append((label, figure, f"<= {ONE_ROW_TARGET_S} s" if bound else "", _verdict(met) if bound else ""))
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
    if not shares and "catch_up" in result:
        table.append(("3. catch-up vs plain recompute", _short(catch_up.get("status")), "", ""))
    refresh = result.get("refresh", {})
    targets = REFRESH_TARGETS.get(scale, {})
    for kind, label in (("stateless", "stateless MV"), ("aggregate", "Q1 aggregate")):
        case = refresh.get(kind, {})
        if "speedup" in case:
            pairs = case.get("refresh_pairs", [])
            plans = [plan for pair in pairs for plan in pair.get("plans", [])]
            summary = {"speedup": case["speedup"], "catch_up_s": case["catch_up_median_s"],
                       "plain_s": case["plain_median_s"], "speedup_vs_snapshot": case.get("speedup_vs_snapshot"),
                       "plans": plans, "floor_s": {"total": case.get("floor_median_s")}}
            table.append(_case(f"3. {label}: one RF1 + RF2 pair (p{refresh['parallelism']})", summary,
                               targets.get(kind)))
        elif "refresh" in result:
            table.append((f"3. {label}: RF1+RF2 catch-up", _short(refresh.get("status")), "", ""))
    submit = result.get("submit", {})
    for kind, label in (("stateless", "stateless MV"), ("aggregate", "Q1 aggregate")):
        case = submit.get(kind, {})
        if "speedup" in case:
            table.append((
                f"3. {label}, each side its own spark-submit: RF1 + RF2 catch-up vs plain recompute",
                f"{_fmt(case['speedup'])}x ({_fmt(case['catch_up_median_s'], ' s')} vs "
                f"{_fmt(case['plain_median_s'], ' s')}; round {_fmt(case.get('round_median_s'), ' s')}"
                f"{_equal_start(case)})",
                f">= {SUBMIT_TARGETS[kind]}x" if scale == 1.0 else "",
                _verdict(case["speedup"] >= SUBMIT_TARGETS[kind]) if scale == 1.0 else "",
            ))
        elif "submit" in result:
            table.append((f"3. {label}, as spark-submit", _short(submit.get("status", case.get("status"))), "", ""))
    return table


def _equal_start(case: dict[str, Any]) -> str:
    """How the phase started, and its ratio against a plain job started on the archive too."""
    if not case.get("jvm_archive"):
        return "; no JVM archive"
    if "speedup_equal_start" not in case:
        return "; catch-up on the JVM archive"
    return (f"; catch-up on the JVM archive, {_fmt(case['speedup_equal_start'])}x against the plain job on it "
            f"({_fmt(case['plain_on_archive_median_s'], ' s')})")


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
