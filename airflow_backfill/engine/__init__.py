"""The engine that plans and runs the three phases; importable without Airflow."""
