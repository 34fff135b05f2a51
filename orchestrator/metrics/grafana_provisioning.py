"""Grafana provisioning for the Kappa dashboard: a file provider for the dashboards folder and a
Prometheus datasource, written beside the dashboard JSON by ``dashboard.write``."""

from __future__ import annotations

# The provisioned datasource; the dashboard's datasource variable defaults to it.
DATASOURCE_UID = "prometheus"

PROVISIONING_DASHBOARDS = """\
# Grafana file provider for the Kappa dashboards: copy to <grafana>/conf/provisioning/dashboards/.
# ADJUST `path` below: the folder holding kappa-replay.json (this repository's dashboards/ folder)
# as Grafana sees it, e.g. mount it with
#   docker run -v "$PWD/dashboards:/var/lib/grafana/dashboards/kappa:ro" ...
# or replace the path with the absolute path of dashboards/ in your checkout.
apiVersion: 1

providers:
  - name: kappa
    orgId: 1
    folder: Kappa
    type: file
    disableDeletion: false
    allowUiUpdates: false
    updateIntervalSeconds: 30
    options:
      path: /var/lib/grafana/dashboards/kappa
      foldersFromFilesStructure: false
"""

PROVISIONING_DATASOURCES = f"""\
# Prometheus datasource for the Kappa dashboards (copy to
# <grafana>/conf/provisioning/datasources/). The dashboard's `datasource` variable defaults to
# uid "{DATASOURCE_UID}"; adjust `url` to where Prometheus listens.
apiVersion: 1

datasources:
  - name: Prometheus
    type: prometheus
    uid: {DATASOURCE_UID}
    access: proxy
    url: http://127.0.0.1:9090
    isDefault: true
    editable: true
    jsonData:
      timeInterval: 5s
"""
