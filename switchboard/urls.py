from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import path, re_path
from django.views.static import serve

from switchboard.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    # The app serves its own small static tree (htmx, css); a proxy may serve it instead.
    re_path(r"^static/(?P<path>.*)$", serve, {"document_root": settings.STATICFILES_DIRS[0]}),
]
