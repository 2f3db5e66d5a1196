"""What an operator's read-only detail page leaves out (trial F15, issue 53): the
model's help texts, which document the schema for developers ("'' = for every group;
else ..."), and the History button, since nothing edits these rows through the admin and
their history is always empty. Mixed into a ``ReadOnlyAdmin`` before it; the page's
``change_form.html`` leaves out ``change_form_object_tools`` (the History link)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class WithoutSchemaHelp:
    """Read-only fields shown without their model field's ``help_text``: Django's admin
    takes a read-only field's help from the form's ``Meta.help_texts`` before the
    model's, so an empty one per field leaves it out."""

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:
        hidden = {str(name): "" for name in
                  self.get_readonly_fields(request, obj)}  # type: ignore[attr-defined]
        kwargs["help_texts"] = {**hidden, **kwargs.get("help_texts", {})}
        return super().get_form(request, obj, change, **kwargs)  # type: ignore[misc]
