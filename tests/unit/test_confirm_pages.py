"""The admin's confirmation pages share one Yes / No form
(``admin/sqlqueue/_confirm_form.html``): each still has its ids, its button text, and
the red button where the action cannot be undone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string

from sqlqueue.models import DeadLetter

BACK = "/admin/back/"


def form_of(template: str, **context: Any) -> str:
    html = render_to_string(f"admin/sqlqueue/{template}",
                            {"back_url": BACK, "opts": DeadLetter._meta, **context})
    start = html.index("<form")
    return " ".join(html[start:html.index("</form>", start)].split())


DEAD = SimpleNamespace(offset=7, consumer_group="g", original_topic="t", partition_key="k",
                       failure_count=3)
TASK = SimpleNamespace(task_path="shop.tasks.mail", id="r1", worker_ids=["w1"])


@pytest.mark.parametrize(("template", "context", "form_id", "label", "danger"), [
    ("confirm_dead_letter.html", {"action": "replay", "dead": DEAD},
     "sqlqueue-confirm-replay", "Yes, replay it", False),
    ("confirm_dead_letter.html", {"action": "discard", "dead": DEAD},
     "sqlqueue-confirm-discard", "Yes, discard it", True),
    ("confirm_task.html", {"action": "retry", "task": TASK, "dead": DEAD},
     "sqlqueue-confirm-task-retry", "Yes, retry it", False),
    ("confirm_task.html", {"action": "discard", "task": TASK, "dead": DEAD},
     "sqlqueue-confirm-task-discard", "Yes, discard it", True),
    ("confirm_stop_runner.html", {"action": "drain", "label": "drain and exit",
                                  "live": True, "runner": "w1"},
     "sqlqueue-confirm-stop-runner", "Yes, drain and exit", False),
    ("confirm_stop_runner.html", {"action": "stop", "label": "stop now", "live": True,
                                  "runner": "w1"},
     "sqlqueue-confirm-stop-runner", "Yes, stop now", True),
    ("confirm_retry_now.html", {"retrying": 2, "group": "g", "topic": "t"},
     None, "Yes, retry now", False),
    ("confirm_replay_matching.html", {"count": 2, "groups": ["g"]},
     None, "Yes, replay them", False),
])
def test_each_confirmation_keeps_its_form(template: str, context: dict[str, Any],
                                          form_id: str | None, label: str,
                                          danger: bool) -> None:
    form = form_of(template, **context)
    assert form.startswith(f'<form method="post" id="{form_id}">' if form_id
                           else '<form method="post">')
    assert f'<input type="submit" value="{label}"' in form
    assert ('class="sqlqueue-danger"' in form) is danger
    assert '<input type="hidden" name="confirmed" value="yes">' in form
    assert f'<a href="{BACK}" class="button cancel-link">No, take me back</a>' in form


def test_the_retire_button_keeps_its_id() -> None:
    form = form_of("confirm_retire_group.html", group="g", topic="t",
                   lag={"partitions": [1], "dead_letters": 0})
    assert ('<input type="submit" value="Yes, retire the group" '
            'id="sqlqueue-retire-confirm">') in form
