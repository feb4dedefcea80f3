"""The `airflow-backfill` command: run the upstream simulator, show and alter a job.

    airflow-backfill simulate --table PATH [--rows N] [--epoch-interval S] [--max-epochs N] ...
    airflow-backfill status --job FILE [--json]
    airflow-backfill alter --job FILE [--backfill-parallelism N] [--rate-limit ROWS_PER_S|0|none]
                           [--max-round-epochs N|none] [--max-round-bytes BYTES|none] [--resume | --reset]
    airflow-backfill maintain --job FILE [--no-cluster] [--no-purge] [--vacuum] [--max-file-size BYTES]
                           [--parallelism N]
    airflow-backfill verify --job FILE [--parallelism N] [--key-ranges N] [--show N]
    airflow-backfill consistent --job FILE [--job FILE ...] [--table URI] [--jobs-in DIR]
                           [--policy common|latest|at] [--at EPOCHS] [--json]
    airflow-backfill jvm-archive [--if-stale]
    airflow-backfill jars fetch [--kafka-broker] [--no-s3a] [--force] | jars conf
    airflow-backfill check --job FILE [--job FILE ...] [--jobs-in DIR] [--with-tables]

Errors the user can fix (a bad job file, a bad option) exit with code 2 and one line
that names the problem and the fix; logs and progress lines go to stderr, results to
stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_backfill.exceptions import BackfillConfigError, BackfillError
from airflow_backfill.folder_cli import add_backfill
from airflow_backfill.jars_cli import add_jars
from airflow_backfill.kafka_cli import add_kafka_demo, add_kafka_status
from airflow_backfill.stop_signals import request_stop_on

if TYPE_CHECKING:
    from airflow_backfill.engine.control import BackfillSettings
    from airflow_backfill.job import BackfillJob

log = logging.getLogger("airflow_backfill.cli")

PROG = "airflow-backfill"
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or more, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected 1 or more, got 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected 0 to 86400 seconds, got {value}")
    return value


# ---- simulate ---------------------------------------------------------------------------


def _add_simulate(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run the `orders` upstream simulator (one Delta version per epoch)",
        description="Create the `orders` upstream (Change Data Feed on) if missing, then commit one "
        "epoch of inserts, updates and deletes every --epoch-interval seconds until --max-epochs, "
        "Ctrl-C or SIGTERM (the current commit always finishes).",
    )
    parser.add_argument("--table", required=True, help="path of the upstream Delta table")
    parser.add_argument("--rows", type=_non_negative_int, default=10_000, help="orders in the initial load")
    parser.add_argument("--epoch-interval", type=_seconds, default=1.0, help="seconds between epochs")
    parser.add_argument("--inserts", type=_non_negative_int, default=50, help="new orders per epoch")
    parser.add_argument("--updates", type=_non_negative_int, default=100, help="updated orders per epoch")
    parser.add_argument("--deletes", type=_non_negative_int, default=20, help="deleted orders per epoch")
    parser.add_argument("--seed", type=int, default=1, help="random seed (same seed, same data)")
    parser.add_argument("--max-epochs", type=_non_negative_int, default=None, help="stop after N epochs")
    parser.set_defaults(run=_run_simulate)


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT ask the loop to stop after the current commit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def announce(signum: int) -> None:
        log.info("%s received: stopping after the current commit", signal.Signals(signum).name)

    previous = request_stop_on(stop, on_request=announce)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_simulate(args: argparse.Namespace) -> int:
    from airflow_backfill.job import normalize_table_uri
    from airflow_backfill.simulator import run_simulator

    table = normalize_table_uri("--table", args.table)
    stop = threading.Event()
    with _stop_on_signals(stop):
        epochs = run_simulator(
            table,
            rows=args.rows,
            epoch_interval=args.epoch_interval,
            inserts=args.inserts,
            updates=args.updates,
            deletes=args.deletes,
            seed=args.seed,
            max_epochs=args.max_epochs,
            stop_event=stop,
        )
    print(json.dumps({"table": table, "epochs": epochs}))
    return EXIT_OK


# ---- status -----------------------------------------------------------------------------


def _add_status(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a job's phase, watermark, lag and progress",
        description="Show a job's phase (snapshot, catch_up, forward), state (creating, created), "
        "watermark, pending upstream epochs and progress. Reads Delta logs only; never starts Spark.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", metavar="FILE", help="the job's YAML file")
    which.add_argument("--jobs-in", metavar="DIR",
                       help="every job of a folder, one line per MV: phase, lag in epochs and seconds, last commit, "
                       "last error")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(run=_run_status)


def _load_job(path: str) -> BackfillJob:
    """The job file's job; with an `aws_conn_id`, its tables on S3 are read with that
    Airflow connection's credentials (else with the shell's AWS_* variables). Airflow is
    imported only then: it costs seconds per command."""
    from airflow_backfill.job import load_job

    job = load_job(path)
    if job.aws_conn_id:
        from airflow_backfill.hooks.delta import DeltaBackfillHook

        DeltaBackfillHook.for_job(job).register_storage()
    return job


def _configure_spark_storage(spark: Any, job: BackfillJob) -> None:
    """Give a Spark session the job's S3 connection (commands that start Spark here)."""
    if job.aws_conn_id:
        from airflow_backfill.engine.spark_s3 import configure_s3a
        from airflow_backfill.hooks.delta import DeltaBackfillHook

        settings = DeltaBackfillHook.for_job(job).s3_settings()
        if settings is not None:
            configure_s3a(spark, settings)


def _run_status(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.status import format_status, job_status

    if args.jobs_in:
        from airflow_backfill.folder_status import as_json, folder_rows, format_folder

        rows, errors = folder_rows(args.jobs_in)
        print(json.dumps(as_json(rows, errors), sort_keys=True, default=str) if args.json
              else format_folder(rows, errors))
        return EXIT_OK

    status = job_status(_load_job(args.job))
    if args.json:
        print(json.dumps(status.to_dict(), sort_keys=True, default=str))
    else:
        print(format_status(status))
    return EXIT_OK


# ---- verify -----------------------------------------------------------------------------

EXIT_DIFFERENT = 1


def _add_verify(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="recompute the query with Spark at the MV's watermark and compare it with the MV",
        description="Read the MV's latest version and its watermark, recompute the query with Spark on "
        "the upstream as of that epoch, and compare: row counts and per-key-range checksums, then the "
        "first differing keys. Exit status 0 when equal, 1 when not, 2 on a usage error.",
    )
    parser.add_argument("--job", required=True, metavar="FILE", help="the job's YAML file")
    parser.add_argument("--parallelism", type=_positive_int, help="Spark parallelism (default: the job's)")
    parser.add_argument("--key-ranges", type=_positive_int, default=64,
                        help="hash ranges of the MV key compared by checksum (default 64)")
    parser.add_argument("--show", type=_positive_int, default=5, help="differing keys to print (default 5)")
    parser.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.spark_session import build_spark_session
    from airflow_backfill.engine.verify import mv_version_and_watermark, verify_mv

    job = _load_job(args.job)
    mv_version_and_watermark(job)  # a missing MV is an error before a JVM starts
    spark = build_spark_session(f"airflow_backfill:{job.name}:verify", args.parallelism or job.parallelism)
    _configure_spark_storage(spark, job)
    try:
        report = verify_mv(spark, job, key_ranges=args.key_ranges, show=args.show)
    finally:
        spark.stop()
    print("\n".join(report.lines()))
    return EXIT_OK if report.equal else EXIT_DIFFERENT


# ---- alter ------------------------------------------------------------------------------

_NO_RATE_LIMIT = "none"
_UNSET = object()
"""--rate-limit not given (None means `--rate-limit none`)."""


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _backfill_parallelism(text: str) -> int:
    """A backfill parallelism within the job's bounds (1..MAX_PARALLELISM)."""
    from airflow_backfill.job import MAX_PARALLELISM

    value = _whole_number(text)
    if not 1 <= value <= MAX_PARALLELISM:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_PARALLELISM}, got {value}")
    return value


def _rate_limit(text: str) -> int | None:
    """Rows per second within the job's bounds, 0 to pause, or `none` to lift the cap while overridden."""
    from airflow_backfill.engine.control import validate_override_rate_limit

    if text.strip().lower() == _NO_RATE_LIMIT:
        return None
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected 1 row per second or more, 0 to pause (or '{_NO_RATE_LIMIT}' to lift the cap), got {value}"
        )
    try:
        return validate_override_rate_limit(value)
    except BackfillConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _round_bound(text: str) -> int | None:
    """A positive cap on one catch-up round, or `none` to lift it while overridden."""
    if text.strip().lower() == _NO_RATE_LIMIT:
        return None
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more (or '{_NO_RATE_LIMIT}' to lift the cap), got {value}")
    return value


def _add_alter(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "alter",
        help="change a running backfill's parallelism, rate limit or round bounds (applies at the next chunk "
        "or round)",
        description="Override the backfill parallelism, the rate limit (0 pauses) and the bounds of a catch-up "
        "round of a job. The phases read the override at their next safe point: the next snapshot chunk or "
        "the next catch-up round. --resume lifts a pause; --reset removes the overrides, so the job file's "
        "values apply again.",
    )
    parser.add_argument("--job", required=True, metavar="FILE", help="the job's YAML file")
    parser.add_argument("--backfill-parallelism", type=_backfill_parallelism, metavar="N",
                        help="Spark parallelism of snapshot chunks and catch-up rounds (1 to 1024)")
    parser.add_argument("--rate-limit", type=_rate_limit, metavar="ROWS_PER_S",
                        help="rows-per-second cap of snapshot and catch-up reads; 0 pauses them at the next "
                        f"chunk or round (progress is kept); '{_NO_RATE_LIMIT}' lifts the cap")
    parser.add_argument("--max-round-epochs", type=_round_bound, metavar="N",
                        help=f"upstream epochs one catch-up round applies at most; '{_NO_RATE_LIMIT}' lifts it")
    parser.add_argument("--max-round-bytes", type=_round_bound, metavar="BYTES",
                        help=f"change-file bytes one catch-up round reads at most; '{_NO_RATE_LIMIT}' lifts it")
    parser.add_argument("--resume", action="store_true",
                        help="lift a pause: the rate limit before it (an earlier override or the job's) applies again")
    parser.add_argument("--reset", action="store_true", help="remove the overrides (back to the job's values)")
    parser.set_defaults(run=_run_alter, rate_limit=_UNSET, max_round_epochs=_UNSET, max_round_bytes=_UNSET)


def _requested_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides asked for, or a usage error naming the conflict."""
    overrides: dict[str, Any] = {}
    if args.backfill_parallelism is not None:
        overrides["backfill_parallelism"] = args.backfill_parallelism
    for key in ("rate_limit", "max_round_epochs", "max_round_bytes"):
        if getattr(args, key) is not _UNSET:
            overrides[key] = getattr(args, key)
    if args.reset and args.resume:
        raise BackfillConfigError("--reset already lifts a pause; give --reset or --resume, not both.")
    for flag, what in (("reset", "restores the job's own values"), ("resume", "lifts a pause")):
        if getattr(args, flag) and overrides:
            raise BackfillConfigError(
                f"--{flag} {what} and cannot be combined with "
                f"{' or '.join('--' + key.replace('_', '-') for key in overrides)}; run alter twice."
            )
    if not args.reset and not args.resume and not overrides:
        raise BackfillConfigError(
            "nothing to alter: give --backfill-parallelism N, --rate-limit ROWS_PER_S, --max-round-epochs N, "
            "--max-round-bytes BYTES, --resume or --reset."
        )
    return overrides


def _describe(settings: BackfillSettings | None) -> str:
    if settings is None:
        return "unreadable overrides"
    if settings.rate_limit is None:
        rate = _NO_RATE_LIMIT
    elif settings.paused:
        rate = "0 (paused)"
    else:
        rate = f"{settings.rate_limit} rows/s"
    described = f"backfill_parallelism={settings.backfill_parallelism}, rate_limit={rate}"
    for name in ("max_round_epochs", "max_round_bytes"):
        if getattr(settings, name) is not None:
            described += f", {name}={getattr(settings, name)}"
    return described


def _run_alter(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.alter import apply_alter

    overrides = _requested_overrides(args)  # usage errors first, before the job file is read
    job = _load_job(args.job)
    result = apply_alter(job, overrides, reset=args.reset, resume=args.resume)
    action = "reset to the job's values" if args.reset else "resumed" if args.resume else "altered"
    print(f"job {job.name}: {action}: {_describe(result.before)} -> {_describe(result.after)}")
    print(result.safe_point.message)
    return EXIT_OK


# ---- maintain ---------------------------------------------------------------------------


def _add_maintain(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "maintain",
        help="compact the MV, cluster it by key, purge deletion vectors, optionally vacuum (runs Spark)",
        description="OPTIMIZE the MV (and an aggregate's state) ZORDER BY its key, REORG ... APPLY (PURGE) "
        "its deletion vectors and, with --vacuum, VACUUM it at the table's own retention. Data, watermark "
        "and change feed stay as they are. Takes the MV's writer lock: run it between phases (or as the "
        "task group's `maintain` task), not while forward runs.",
    )
    parser.add_argument("--job", required=True, metavar="FILE", help="the job's YAML file")
    parser.add_argument("--no-cluster", dest="cluster", action="store_false", help="compact without ZORDER BY")
    parser.add_argument("--no-purge", dest="purge", action="store_false", help="keep deletion vectors")
    parser.add_argument("--vacuum", action="store_true", help="delete unreferenced files past the retention")
    parser.add_argument("--max-file-size", type=_positive_int, default=None, metavar="BYTES",
                        help="largest file OPTIMIZE writes (default: Delta's 1 GiB); smaller keeps a small MV "
                        "in several key ranges that rounds can skip")
    parser.add_argument("--parallelism", type=_backfill_parallelism, default=None, metavar="N",
                        help="Spark parallelism (default: the job's backfill_parallelism)")
    parser.set_defaults(run=_run_maintain)


def _run_maintain(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.maintenance import maintain_mv
    from airflow_backfill.engine.spark_session import build_spark_session

    job = _load_job(args.job)
    spark = build_spark_session(f"airflow_backfill-{job.name}-maintain", args.parallelism or job.backfill_parallelism)
    _configure_spark_storage(spark, job)
    try:
        result = maintain_mv(spark, job, cluster=args.cluster, purge=args.purge, vacuum=args.vacuum,
                             max_file_size=args.max_file_size)
    finally:
        spark.stop()
    print(f"job {job.name}: maintained {', '.join(result.tables)}: {result.files_before} files -> "
          f"{result.files_after} in {result.seconds:.1f}s")
    return EXIT_OK


# ---- jvm-archive ------------------------------------------------------------------------


def _add_jvm_archive(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "jvm-archive",
        help="build the class-data-sharing archive the phases' driver JVMs start on (runs Spark)",
        description="Run a small snapshot and catch-up in one spark-submit whose JVM archives the classes "
        "it loaded (in the provider's cache, or the file [airflow_backfill] jvm_archive names). The phase "
        "operators start each driver on it when it is current, which saves seconds of class loading per phase; "
        "without it they start as usual. Rebuild it after changing Java, Spark or the jars (--if-stale does "
        "only then); jvm_archive = off starts drivers without it.",
    )
    parser.add_argument("--if-stale", action="store_true",
                        help="build only when the archive is missing or was built for other jars or another Java")
    parser.set_defaults(run=_run_jvm_archive)


def _run_jvm_archive(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.launch.class_archive import archive_is_current, archive_path, build_archive

    if args.if_stale and archive_is_current():
        print(f"the JVM archive {archive_path()} is up to date")
        return EXIT_OK
    seconds = build_archive()
    print(f"built the JVM archive {archive_path()} in {seconds:.0f}s")
    return EXIT_OK


# ---- consistent -------------------------------------------------------------------------

EXIT_NOT_CONSISTENT = 1


def _add_consistent(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "consistent",
        help="show the version of each MV to read so that all reflect the same upstream epochs",
        description="Find one Delta version of each MV (and upstream table) named, all reflecting the same "
        "upstream epochs, and print each table's version and epochs. Policies: common (the newest epochs every "
        "table has committed; the default), latest (each table's newest version), at (the versions at the "
        "epochs --at gives). Reads Delta logs only; never starts Spark. Exit status 0 with an answer, 1 when "
        "the tables do not agree as asked (not yet, or the versions are gone), 2 on a usage error.",
    )
    parser.add_argument("--job", action="append", default=[], metavar="FILE",
                        help="a job file (Delta or Kafka) whose MV to read; repeat for each MV")
    parser.add_argument("--table", action="append", default=[], metavar="URI",
                        help="a Delta table to read too (an upstream, or an MV by its path); repeatable")
    parser.add_argument("--jobs-in", metavar="DIR",
                        help="also every job file in DIR; those still being created are left out")
    parser.add_argument("--policy", choices=("common", "latest", "at"), help="how to choose (default: common, "
                        "or at when --at is given)")
    parser.add_argument("--at", metavar="EPOCHS",
                        help="the epochs to read at: a version of the one upstream (1200), or TABLE=VERSION,... "
                        "(orders=1200,customers=310); implies --policy at")
    parser.add_argument("--history", type=_positive_int, default=None,
                        help="versions of each MV searched at most (default 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(run=_run_consistent)


def _run_consistent(args: argparse.Namespace) -> int:
    from airflow_backfill.consistent_reads import consistent_versions, job_files_in, load_any_job
    from airflow_backfill.engine.consistency.answer import DEFAULT_HISTORY
    from airflow_backfill.exceptions import ConsistencyError

    if not args.job and not args.table and not args.jobs_in:
        raise BackfillConfigError("name the MVs to read: --job FILE (repeat it), --table URI or --jobs-in DIR.")
    policy = args.policy or ("at" if args.at is not None else "common")
    from airflow_backfill.job import normalize_table_uri

    jobs = [_registered(load_any_job(path)) for path in args.job]
    tables = [normalize_table_uri("--table", uri) for uri in args.table]
    named = [*jobs, *tables]
    given = {job.target for job in jobs} | set(tables)
    others = [] if args.jobs_in is None else [
        job for job in (_registered(load_any_job(path)) for path in job_files_in(args.jobs_in))
        if job.target not in given
    ]
    try:
        answer = consistent_versions(named, also=others, policy=policy, at=args.at,
                                     history=args.history or DEFAULT_HISTORY)
    except ConsistencyError as error:
        message = " ".join(str(error).split())
        print(f"{PROG} consistent: {message}", file=sys.stderr)
        return EXIT_NOT_CONSISTENT
    if args.json:
        print(json.dumps(answer.to_dict(), sort_keys=True))
    else:
        print("\n".join(answer.lines()))
    return EXIT_OK


def _registered(job: Any) -> Any:
    """A Delta job with an `aws_conn_id` gets its connection's S3 settings (as `_load_job`)."""
    if getattr(job, "aws_conn_id", None):
        from airflow_backfill.hooks.delta import DeltaBackfillHook

        DeltaBackfillHook.for_job(job).register_storage()
    return job


# ---- check ------------------------------------------------------------------------------

EXIT_REFUSED = 1


def _add_check(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="load job files as a DAG would and print what it would refuse (for a job folder's CI)",
        description="Load each job file as the DAG processor does (fields, table paths, the query's constructs "
        "and key, a folder's unique names and targets) and print one line per job file: its path, then `ok` or "
        "what is wrong. Needs neither Spark nor Airflow's database. Exit status 0 when every job loads, 1 when "
        "one is refused, 2 on a usage error.",
    )
    parser.add_argument("--job", action="append", default=[], metavar="FILE",
                        help="a job file (Delta or Kafka); repeat for each file")
    parser.add_argument("--jobs-in", action="append", default=[], metavar="DIR",
                        help="every job file of DIR, as `backfill_dags(DIR)` loads them; repeatable")
    parser.add_argument("--with-tables", action="store_true",
                        help="also read each upstream with delta-rs, as pin_epoch does: it exists, keeps its change "
                        "feed and holds the key; a join's columns resolve (S3 tables with the shell's AWS_* "
                        "variables)")
    parser.set_defaults(run=_run_check)


def _run_check(args: argparse.Namespace) -> int:
    from airflow_backfill.job_check import check_job_files, check_job_folder

    if not args.job and not args.jobs_in:
        raise BackfillConfigError("name the job files to check: --job FILE (repeat it) or --jobs-in DIR.")
    checks = check_job_files(args.job, with_tables=args.with_tables)
    for folder in args.jobs_in:
        checks += check_job_folder(folder, with_tables=args.with_tables)
    for check in checks:
        print(check.line)
    refused = sum(check.problem is not None for check in checks)
    if refused:
        print(f"{PROG} check: {refused} of {len(checks)} job files refused", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


# ---- command table ----------------------------------------------------------------------

COMMANDS: tuple[Callable[[Any], None], ...] = (
    _add_simulate,
    _add_status,
    add_backfill,
    _add_alter,
    _add_maintain,
    add_kafka_status,
    add_kafka_demo,
    _add_verify,
    _add_consistent,
    _add_jvm_archive,
    add_jars,
    _add_check,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Backfill and maintain materialized views.")
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="logging level of the progress lines on stderr (default INFO)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, or a usage error already printed
        return int(exit_request.code or 0)
    _configure_logging(args.log_level)
    try:
        return args.run(args)
    except BackfillError as error:
        message = " ".join(str(error).split())  # one line, whatever the cause spelled out
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
