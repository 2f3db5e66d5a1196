"""Issue 53, the operator's trial (wave-4 new-user trial): the Schedules page is the one
entry for schedules (F10), with the editable ones' next and last tick beside the setting's,
their pause and resume, and each save landing on it; its "last message" link is drawn
only while the message can be shown (F2: with the default RETENTION = 0 an acked tick is
collected within seconds, and the link led to "Message ... doesn't exist")."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from sqlqueue.models import QueueMessage, StoredSchedule
from sqlqueue.operations.schedules import run_schedule_now
from sqlqueue.operations.stored_schedules import save_stored_schedule
from tests.integration.test_admin import admin_client, staff_with
from tests.integration.test_schedule_edges import form

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["admin_client"]
SCHEDULES = "admin:sqlqueue_schedulestate_changelist"


def message_link(offset: int) -> str:
    return f'href="{reverse("admin:sqlqueue_queuemessage_change", args=[offset])}"'


def test_the_last_message_is_linked_only_while_it_can_be_shown(admin_client: Client) -> None:
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    tick = run_schedule_now("beat")
    page = admin_client.get(reverse(SCHEDULES)).text
    assert message_link(tick.offset) in page and "collected" not in page
    assert admin_client.get(reverse("admin:sqlqueue_queuemessage_change",
                                    args=[tick.offset])).status_code == 200
    # Garbage collection deletes an acked message at once by default (RETENTION = 0).
    QueueMessage.objects.filter(offset=tick.offset).delete()
    page = admin_client.get(reverse(SCHEDULES)).text
    assert message_link(tick.offset) not in page
    assert tick.message_id in page and f"offset {tick.offset}, " in page
    assert 'class="sqlqueue-collected"' in page and "RETENTION" in page


def test_no_message_link_for_who_may_not_see_messages() -> None:
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    tick = run_schedule_now("beat")
    viewer = staff_with("view_schedulestate")
    page = viewer.get(reverse(SCHEDULES)).text
    assert tick.message_id in page and message_link(tick.offset) not in page


def test_schedules_are_one_entry_of_the_admin(admin_client: Client) -> None:
    index = admin_client.get(reverse("admin:app_list", args=["sqlqueue"])).text
    assert reverse(SCHEDULES) in index
    assert reverse("admin:sqlqueue_storedschedule_changelist") not in index
    # The stored list stays, linked from the Schedules page, for search and bulk actions.
    page = admin_client.get(reverse(SCHEDULES)).text
    assert 'id="sqlqueue-stored-list"' in page
    assert admin_client.get(reverse("admin:sqlqueue_storedschedule_changelist")).status_code \
        == 200


def test_a_user_of_stored_schedules_alone_sees_them_on_the_schedules_page() -> None:
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    editor = staff_with("view_storedschedule", "add_storedschedule", "change_storedschedule")
    page = editor.get(reverse(SCHEDULES))
    assert page.status_code == 200 and "beat" in page.text and "every 60s" in page.text
    index = editor.get(reverse("admin:index")).text
    assert reverse(SCHEDULES) in index


def test_a_save_lands_on_the_schedules_page_with_its_next_tick() -> None:
    editor = staff_with("view_storedschedule", "add_storedschedule", "change_storedschedule")
    saved = editor.post(reverse("admin:sqlqueue_storedschedule_add"),
                        form(name="beat", every="60", topic="beats"), follow=True)
    assert saved.redirect_chain[-1][0] == reverse(SCHEDULES)
    assert "beat" in saved.text and "every 60s" in saved.text
    change = reverse("admin:sqlqueue_storedschedule_change", args=["beat"])
    edited = editor.post(change, form(name="beat", every="120", topic="beats"), follow=True)
    assert edited.redirect_chain[-1][0] == reverse(SCHEDULES) and "every 120s" in edited.text


def test_stored_schedules_are_paused_and_resumed_from_the_schedules_page() -> None:
    save_stored_schedule("beat", {"topic": "beats", "every": 60})
    pause = reverse("admin:sqlqueue_schedulestate_pause")
    viewer = staff_with("view_storedschedule", "view_schedulestate")
    assert 'value="Pause"' not in viewer.get(reverse(SCHEDULES)).text
    assert viewer.post(pause, {"name": "beat", "paused": "1"}).status_code == 403
    assert not StoredSchedule.objects.get().paused
    editor = staff_with("view_storedschedule", "change_storedschedule")
    assert editor.get(pause).status_code == 403  # no change by GET
    page = editor.get(reverse(SCHEDULES)).text
    assert 'value="Pause"' in page
    paused = editor.post(pause, {"name": "beat", "paused": "1"}, follow=True)
    assert "Paused: beat." in paused.text and 'value="Resume"' in paused.text
    assert StoredSchedule.objects.get().paused
    resumed = editor.post(pause, {"name": "beat", "paused": "0"}, follow=True)
    assert "Resumed" in resumed.text and not StoredSchedule.objects.get().paused
