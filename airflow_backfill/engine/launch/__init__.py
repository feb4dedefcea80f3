"""How a phase's driver JVM starts: the JIT compiler it gets (`jit`) and the class-data
archive that shortens its start (`class_archive`). Free of Spark imports: the Airflow
operators call it before `spark-submit`."""
