from __future__ import annotations

from django.urls import path

from benchmarks.projects.views import enqueue_view

urlpatterns = [path("enqueue", enqueue_view)]
