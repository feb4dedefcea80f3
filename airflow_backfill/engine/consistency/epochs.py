"""Epochs as people give them (`--at 1200`, `orders=1200,customers=310`, a mapping from an
asset event) turned into the engine's `{base table URI: version}`, validated first."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from airflow_backfill.engine.consistency.history import Epochs
from airflow_backfill.engine.consistency.tables import table_name
from airflow_backfill.exceptions import BackfillConfigError


def parse_epochs(value: Any) -> int | dict[str, int]:
    """`1200` or `orders=1200,customers=310` (a string, as the CLI and templates give it; a
    template may also render a mapping as its text), an int, or a mapping of table to
    version; versions are whole numbers >= 0."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):  # a mapping rendered by a template: JSON or Python's repr
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise BackfillConfigError(f"epochs {text!r} is not a mapping of table to version.") from None
            if not isinstance(value, Mapping):
                raise BackfillConfigError(f"epochs {text!r} is not a mapping of table to version.")
            return {str(name): _version(str(name), version) for name, version in value.items()}
        if "=" not in text:
            return _version("epoch", text)
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        if any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
            raise BackfillConfigError(f"epochs {value!r} must read TABLE=VERSION[,TABLE=VERSION...], e.g. orders=1200.")
        return {name.strip(): _version(name.strip(), version.strip()) for name, version in pairs}
    if isinstance(value, Mapping):
        return {str(name): _version(str(name), version) for name, version in value.items()}
    return _version("epoch", value)


def _version(name: str, value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackfillConfigError(f"the epoch of {name} must be a Delta version (a whole number >= 0), got {value!r}.")
    return value


def resolve_epochs(value: Any, bases: set[str], *, every_base: bool) -> Epochs:
    """`value` (see `parse_epochs`) as versions of the base tables `bases` (URIs).

    A bare number names the only base table; a table is named by its URI or its folder
    name. `every_base`: each base table must be given (`at`); else a subset will do (a
    lower bound).
    """
    parsed = parse_epochs(value)
    names = ", ".join(sorted(table_name(base) for base in bases))
    if isinstance(parsed, int):
        if len(bases) != 1:
            raise BackfillConfigError(
                f"the tables read {len(bases)} upstream tables ({names}): give a version for each, "
                f"e.g. {','.join(f'{table_name(b)}={parsed}' for b in sorted(bases))}."
            )
        return {next(iter(bases)): parsed}
    epochs = {_base_named(name, bases, names): version for name, version in parsed.items()}
    missing = sorted(table_name(base) for base in bases - set(epochs))
    if every_base and missing:
        raise BackfillConfigError(f"give an epoch for every upstream table the tables read; missing: {', '.join(missing)}.")
    return epochs


def _base_named(name: str, bases: set[str], names: str) -> str:
    if name in bases:
        return name
    matches = [base for base in bases if table_name(base) == name or base.rstrip("/") == name.rstrip("/")]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BackfillConfigError(f"{name!r} names several upstream tables ({', '.join(sorted(matches))}); "
                                  "give its full URI.")
    raise BackfillConfigError(f"{name!r} is not an upstream table of the tables read; they read {names}.")


def at_least(epochs: Mapping[str, int], minimum: Mapping[str, int]) -> bool:
    """Whether `epochs` is at or past `minimum` for every base table `minimum` names."""
    return all(base in epochs and epochs[base] >= version for base, version in minimum.items())
