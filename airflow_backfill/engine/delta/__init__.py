"""Delta Lake access: delta-spark on the Spark side (every write), delta-rs where no JVM runs."""
