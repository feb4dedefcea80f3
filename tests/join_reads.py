"""How join rounds read the other tables' rows, for tests that run them both ways."""

from __future__ import annotations


def spark_reads_only(monkeypatch) -> None:
    """Make rounds read the feeds and the other tables' rows through Spark alone, and keep
    their keyed changes there, as they do for tables the driver does not read (too large,
    deletion vectors) and changes too many to hold."""
    from size_overrides import set_sizes

    from airflow_backfill.engine.joins import delta_rule, relation

    monkeypatch.setattr(delta_rule, "feed_in_driver", lambda *args, **kwargs: None)
    monkeypatch.setattr(relation.Reader, "lookup", lambda *args, **kwargs: None)
    set_sizes(monkeypatch, driver_rows=0)


def driver_lookups(monkeypatch) -> list[str]:
    """The tables whose rows the driver looked up in rounds (appended to as they run)."""
    from airflow_backfill.engine.joins import relation

    found: list[str] = []
    lookup = relation.Reader.lookup

    def recorded(self, index, *args, **kwargs):
        rows = lookup(self, index, *args, **kwargs)
        if rows is not None:
            found.append(self._plan.tables[index].name)
        return rows

    monkeypatch.setattr(relation.Reader, "lookup", recorded)
    return found


def refuse_lookups_of(monkeypatch, name: str) -> None:
    """Make the driver leave the rows of upstream `name` to Spark (as for a table with
    deletion vectors), so that walks switch from the driver's rows to Spark midway."""
    from airflow_backfill.engine.joins import relation

    lookup = relation.Reader.lookup

    def refusing(self, index, *args, **kwargs):
        return None if self._plan.tables[index].name == name else lookup(self, index, *args, **kwargs)

    monkeypatch.setattr(relation.Reader, "lookup", refusing)
