"""Airflow integration in the style of a provider: a hook that builds settings from Airflow
Connections, operators, a deferrable catch-up sensor and its trigger.

Modules here import only Airflow's task SDK at the top; the orchestrator's drivers (psycopg,
confluent-kafka) load when a task runs, so DAG files that name these operators parse fast.
"""
