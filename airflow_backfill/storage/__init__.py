"""Where the tables live: local paths or an S3-compatible object store.

Everything outside Spark that touches a table's files (Delta log listings, the job's
small state files, the writer lock) goes through this package, so that the engine,
the hooks, the sensor, the trigger and the CLI work the same on both.
"""
