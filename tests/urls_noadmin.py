"""The URLs of tests/settings_noadmin.py: BackWave's own, and no admin."""

from django.urls import include, path

urlpatterns = [path("backwave/", include("backwave.urls"))]
