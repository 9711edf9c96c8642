from django.contrib import admin
from django.urls import include, path

from project.demo.views import favicon

urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path("backwave/", include("backwave.urls")),
    path("", include("project.demo.urls")),
]
