"""Prometheus: the exporter, outcome metrics read back through PromQL, and the Grafana
dashboard built from Python."""
