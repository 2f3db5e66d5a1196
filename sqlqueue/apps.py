from __future__ import annotations

from django.apps import AppConfig, apps
from django.conf import settings


class SqlqueueConfig(AppConfig):
    name = "sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sqlqueue import checks  # noqa: F401  (registers the system checks)
        from sqlqueue.database_names import remember_configured_names

        # Before any test database exists (sqlqueue.testing refuses other databases).
        remember_configured_names(settings.DATABASES)
        from sqlqueue.consuming.registry import autodiscover
        from sqlqueue.integrations.tasks.registration import register_task_consumers

        autodiscover()
        from sqlqueue.consuming.gc import register_collection
        from sqlqueue.integrations.tasks.retention import collect_results

        register_collection(collect_results)  # expired task results go with the log's garbage
        from sqlqueue.consuming.rollup import collect_minute_stats

        register_collection(collect_minute_stats)  # the live overview's rows older than an hour
        from sqlqueue.integrations.tasks.schedules import register_task_target

        register_task_target()  # schedules naming a task enqueue it
        from sqlqueue import stored_schedule_rows

        stored_schedule_rows.connect()  # a re-created stored schedule starts afresh (F14)
        register_task_consumers()  # TASKS backends of ours: a consumer per queue
        if apps.is_installed("django.contrib.admin"):
            from sqlqueue.integrations.tasks import admin  # noqa: F401  (the results page)
