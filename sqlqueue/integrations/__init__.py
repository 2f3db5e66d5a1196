"""Integrations of sqlqueue with other frameworks.

``tasks``: a backend for Django's Tasks framework (``django.tasks``, Django 6.0+, or the
``django-tasks`` backport on Django 5.2), so that ``@task`` functions run in
``runconsumer`` workers with sqlqueue's retries, dead letters and leases.
"""
