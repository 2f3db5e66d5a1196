"""URLs: the order form at /orders/ and the admin at /admin/."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from example_project.shop import views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="orders", permanent=False)),
    path("orders/", views.orders, name="orders"),
    path("admin/", admin.site.urls),
]
