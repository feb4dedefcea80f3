"""Consistent reads across MVs: one version of each table, all reflecting the same upstream
epochs, found in the Delta logs alone (no Spark, no Airflow).

`tables` says how each kind of table records the epochs it reflects; `history` reads them
version by version, mapped through MV-on-MV chains down to the base tables; `policies`
chooses the versions (`common`, `latest`, `at`); `readable` checks that a chosen version
was not vacuumed; `answer` is what comes back; `readers` opens the versions with delta-rs
or Spark. See docs/consistent-reads.md.
"""
