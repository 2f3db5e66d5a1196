"""``path("queue/", include("sqlqueue.urls"))`` serves ``queue/metrics/``
(docs/guides/monitoring.md)."""

from django.urls import path

from sqlqueue import views

app_name = "sqlqueue"
urlpatterns = [path("metrics/", views.metrics, name="metrics")]
