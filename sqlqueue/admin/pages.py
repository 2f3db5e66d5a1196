"""What the admin's own pages share: the URL of a model admin's page, the context of a
page that asks before it acts on one object, and how often a live page reloads."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

#: a live page (lag, subscribers, dead letters, the live overview) reloads its content
#: this often (``_auto_refresh.html``); the dead letters' list not while the operator has
#: selected rows or is in its form (issue 53)
REFRESH_SECONDS = 10


def admin_url(model_admin: admin.ModelAdmin[Any], name: str, *args: str) -> str:
    """The URL of one of ``model_admin``'s pages on its own admin site: "changelist",
    "change" (with the object's id), or a view it adds."""
    opts = model_admin.opts
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{name}", args=args,
                   current_app=model_admin.admin_site.name)


def confirmation_page(model_admin: admin.ModelAdmin[Any], request: HttpRequest,
                      template: str, object_id: str, **context: Any) -> TemplateResponse:
    """A page that asks before acting on the object ``object_id``; its "No" leads back to
    the object's page (``admin/sqlqueue/_confirm_form.html``)."""
    return TemplateResponse(request, template, {
        **model_admin.admin_site.each_context(request), "opts": model_admin.opts,
        "back_url": admin_url(model_admin, "change", object_id), **context,
    })
