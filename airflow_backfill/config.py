"""The provider's settings: the `[airflow_backfill]` section of Airflow's configuration.

Each option is declared once here (`OPTIONS`): `get_provider_info()` publishes them as the
provider's `config` section, so `airflow config get-value airflow_backfill <option>` and
`airflow config list` show them, and `setting(name)` reads one. Precedence, first found:

1. the environment variable `AIRFLOW_BACKFILL_<OPTION>` (the provider's own override,
   which the operators also hand to the `spark-submit` they start);
2. Airflow's configuration (`AIRFLOW__AIRFLOW_BACKFILL__<OPTION>`, then `airflow.cfg`'s
   `[airflow_backfill]` section);
3. the option's default.

Airflow's configuration is asked through Airflow's own `conf` when this process has
loaded it already (a task, the DAG processor, the scheduler, the `airflow` command). In
any other process (a phase's driver, the `airflow-backfill` command, the engine's tests)
Airflow is not imported for it (a second of start-up): the `AIRFLOW__...` variable and
the `[airflow_backfill]` section of `airflow.cfg` (`$AIRFLOW_CONFIG`, else
`$AIRFLOW_HOME/airflow.cfg`) are read directly. Nothing here imports Spark.
"""

from __future__ import annotations

import configparser
import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SECTION = "airflow_backfill"
ENV_PREFIX = "AIRFLOW_BACKFILL_"
ADDED_IN = "0.1.0"


@dataclass(frozen=True)
class Option:
    """One setting of the `[airflow_backfill]` section."""

    name: str
    description: str
    type: str
    """`string`, `integer` or `float`, as Airflow's config reference names types."""
    default: str
    """The value when nothing sets it; "" where the description says what an unset option means."""
    example: str

    @property
    def environment_variable(self) -> str:
        """The provider's own override, `AIRFLOW_BACKFILL_<NAME>`."""
        return ENV_PREFIX + self.name.upper()

    @property
    def airflow_variable(self) -> str:
        """Airflow's environment form of the option, `AIRFLOW__AIRFLOW_BACKFILL__<NAME>`."""
        return f"AIRFLOW__{SECTION.upper()}__{self.name.upper()}"

    def provider_info(self) -> dict[str, Any]:
        """The option as a provider's `config` section declares it."""
        return {"description": self.description, "version_added": ADDED_IN, "type": self.type,
                "example": self.example, "default": self.default}


OPTIONS = (
    Option("home", "Where the example DAGs and job files keep their tables: the value of ${AIRFLOW_BACKFILL_HOME} "
           "in a job file's paths.", "string", "~/airflow_backfill", "/data/lake"),
    Option("cache_dir", "The user-writable folder that holds the jars `airflow-backfill jars fetch` resolves and "
           "the JVM class archive `airflow-backfill jvm-archive` builds. Empty: $XDG_CACHE_HOME/airflow-backfill, "
           "else ~/.cache/airflow-backfill.", "string", "", "/opt/airflow/airflow-backfill-cache"),
    Option("jars_dir", "The folder of the Spark jars the phases load through spark.jars (Delta Lake and Spark's "
           "Kafka connector, as `airflow-backfill jars fetch` resolves them), or `provided` when the Spark "
           "installation already has Delta Lake. Empty: the provider's version's folder under cache_dir.",
           "string", "", "provided"),
    Option("s3a_jars_dir", "The folder of Hadoop's S3A jars (hadoop-aws and the AWS SDK modules it needs), put on "
           "the driver's and executors' classpath for s3:// tables, or `provided` when the cluster has S3A. Empty: "
           "the provider's version's folder under cache_dir. The folder must exist at the same path on every "
           "host that runs an executor.", "string", "", "/opt/spark/s3a-jars"),
    Option("jvm_archive", "The class-data-sharing archive the phases' driver JVMs start on (seconds sooner each; "
           "built by `airflow-backfill jvm-archive`), or `off`. Empty: under cache_dir. A missing or stale "
           "archive is never an error: the drivers start without it.", "string", "", "off"),
    Option("kafka_broker_jars", "The folder of Apache Kafka's broker jars for the loopback broker of "
           "`airflow-backfill kafka-demo` and the tests (`airflow-backfill jars fetch --kafka-broker`). Empty: "
           "the provider's version's folder under cache_dir.", "string", "", "/opt/kafka/libs"),
    Option("lease_seconds", "How long the writer's lease on an MV on S3 lasts without renewal: how long an MV "
           "stays blocked after its writer crashed.", "float", "60", "30"),
    Option("asset_event_poll_interval", "Seconds between two reads of an MV's Delta log by the MV's asset watcher, "
           "the trigger that turns the commits of a running forward (the shared forward's included) into asset "
           "events on the MV; it runs in the triggerer while an unpaused DAG is scheduled on the MV.", "float", "2",
           "5"),
    Option("asset_event_min_interval", "Seconds at least between two asset events the watcher of one MV sends: the "
           "commits in between are coalesced into the next event, which carries the newest watermark and how many "
           "commits it covers. 0: one event per read of the log.", "float", "10", "60"),
    Option("sizes", "The size thresholds that choose between the driver's Arrow paths and Spark (docs/sizes.md): "
           "a preset (`default`, `spark`) or a JSON object of thresholds. Empty: the defaults.", "string", "",
           '{"driver_rows": 5000}'),
)
BY_NAME = {option.name: option for option in OPTIONS}
OFF = "off"
PROVIDED = "provided"


def setting(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The option's value (stripped), by the precedence of the module's docstring.

    `environ`: the environment to read instead of the process's (for a spark-submit's).
    """
    option = BY_NAME[name]
    environ = os.environ if environ is None else environ
    own = environ.get(option.environment_variable, "").strip()
    if own:
        return own
    configured = _airflow_setting(option, environ)
    return option.default if configured is None else configured


def _airflow_setting(option: Option, environ: Mapping[str, str]) -> str | None:
    loaded = sys.modules.get("airflow.configuration")
    if loaded is not None and environ is os.environ:
        value = loaded.conf.get(SECTION, option.name, fallback=None)
        return None if value is None else str(value).strip()
    if option.airflow_variable in environ:
        return environ[option.airflow_variable].strip()
    return _airflow_cfg(_airflow_cfg_path(environ)).get(option.name)


def _airflow_cfg_path(environ: Mapping[str, str]) -> str:
    given = environ.get("AIRFLOW_CONFIG")
    if given:
        return os.path.expanduser(os.path.expandvars(given))
    home = os.path.expanduser(os.path.expandvars(environ.get("AIRFLOW_HOME") or "~/airflow"))
    return os.path.join(home, "airflow.cfg")


@functools.lru_cache(maxsize=8)
def _airflow_cfg(path: str) -> dict[str, str]:
    """The `[airflow_backfill]` section of an airflow.cfg, read once per process."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    if not parser.has_section(SECTION):
        return {}
    return {key: value.strip() for key, value in parser.items(SECTION)}


def cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """The provider's user cache (jars, the JVM archive)."""
    environ = os.environ if environ is None else environ
    configured = setting("cache_dir", environ)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "airflow-backfill")


def provider_config() -> dict[str, Any]:
    """The provider info's `config` section."""
    return {SECTION: {
        "description": "Settings of the airflow-backfill provider. Each option can also be set with the "
                       "environment variable AIRFLOW_BACKFILL_<OPTION>, which takes precedence.",
        "options": {option.name: option.provider_info() for option in OPTIONS},
    }}


def settings_environment() -> dict[str, str]:
    """Every option set to something else than its default, as `AIRFLOW_BACKFILL_*`
    variables: what a task hands to the spark-submit it starts, whose driver does not load
    Airflow's configuration."""
    environment = {}
    for option in OPTIONS:
        value = setting(option.name)
        # Airflow's configuration expands `~` in a default: compare the values expanded.
        if value and os.path.expanduser(value) != os.path.expanduser(option.default):
            environment[option.environment_variable] = value
    return environment
