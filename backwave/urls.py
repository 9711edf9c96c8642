"""BackWave's own URLs, for a project's urls.py: ``path("backwave/", include("backwave.urls"))``
serves the cluster's Prometheus metrics at ``backwave/metrics``."""

from django.urls import path

from .ops.metrics import metrics_view

app_name = "backwave"

urlpatterns = [path("metrics", metrics_view, name="metrics")]
