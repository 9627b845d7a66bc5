"""The chat list's set-based actions: cancel, halt (asking for the reason), resume, switch
model (asking for the model); "select all" acts on every chat of the filter in batches, and
each chat changed gets a history entry."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from agentloop.models import Chat, ChatState

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:agentloop_chat_changelist")


def post_action(client, action, chats, url=CHANGELIST, **fields):
    data = {"action": action, "_selected_action": [chat.pk for chat in chats], **fields}
    return client.post(url, data)


def make(count, **fields):
    return [Chat.objects.create(model="scripted:test", **fields) for _ in range(count)]


def states(name="halt_reason"):
    return list(Chat.objects.order_by("pk").values_list(name, flat=True))


def test_halt_asks_for_the_reason_first_and_changes_nothing_meanwhile(admin_client):
    chats = make(2, state=ChatState.QUEUED)

    page = post_action(admin_client, "halt_chats", chats)

    assert page.status_code == 200
    content = page.content.decode()
    assert "Halt the runs of these chats" in content
    assert "2 chats selected." in content
    assert 'name="reason"' in content
    assert states() == ["", ""]


def test_halt_with_a_reason_halts_the_runs_and_logs_each_chat(admin_client, admin_user):
    running = make(2, state=ChatState.QUEUED)
    idle = make(1)

    response = post_action(
        admin_client, "halt_chats", running + idle, apply="1", reason="provider outage"
    )

    assert response.status_code == 302
    assert states() == ["provider outage", "provider outage", ""]
    entries = LogEntry.objects.order_by("object_id")
    assert [(e.object_id, e.change_message, e.user) for e in entries] == [
        (str(chat.pk), "Halt requested: provider outage", admin_user) for chat in running
    ]
    messages = [str(m) for m in admin_client.get(CHANGELIST).context["messages"]]
    assert messages == ["Halt requested for 2 chat(s).", "1 chat(s) had no run to halt."]


def test_halt_without_a_reason_asks_again(admin_client):
    chats = make(1, state=ChatState.QUEUED)
    response = post_action(admin_client, "halt_chats", chats, apply="1", reason="  ")
    assert response.status_code == 400
    assert "Give a reason for the halt." in response.content.decode()
    assert states() == [""]


def test_select_all_acts_on_every_chat_of_the_filter(admin_client):
    queued = make(3, state=ChatState.QUEUED)
    make(2, state=ChatState.IDLE)
    url = f"{CHANGELIST}?state__exact=queued"

    # The action's page carries "select across" on: the chats of the filter, not a page.
    page = post_action(admin_client, "halt_chats", queued[:1], url=url, select_across="1")
    assert 'name="select_across" value="1"' in page.content.decode()
    post_action(
        admin_client, "halt_chats", queued[:1], url=url, select_across="1", apply="1",
        reason="outage",
    )  # fmt: skip

    assert states() == ["outage"] * 3 + ["", ""]


def test_switch_model_switches_the_chats_no_run_holds(admin_client):
    chats = make(2)
    running = make(1, state=ChatState.RUNNING)

    post_action(admin_client, "switch_model", chats + running, apply="1", model="offline:test")

    assert states("model") == ["offline:test", "offline:test", "scripted:test"]
    messages = [str(m) for m in admin_client.get(CHANGELIST).context["messages"]]
    assert messages == [
        "2 chat(s) switched to the new model.",
        "1 chat(s) are running and keep their model.",
    ]


def test_switch_model_to_a_model_nobody_serves_says_why_and_changes_nothing(admin_client):
    chats = make(2)
    response = post_action(admin_client, "switch_model", chats, apply="1", model="nowhere:x")
    assert response.status_code == 400
    assert "nowhere" in response.content.decode()
    assert states("model") == ["scripted:test", "scripted:test"]
    assert not LogEntry.objects.exists()


def test_model_text_on_the_action_page_is_escaped(admin_client):
    chats = make(1)
    response = post_action(
        admin_client, "switch_model", chats, apply="1", model='<script>alert("x")</script>'
    )
    content = response.content.decode()
    assert "<script>alert" not in content
    assert "&lt;script&gt;" in content


def test_cancel_logs_only_the_chats_it_cancelled(admin_client):
    running = make(1, state=ChatState.RUNNING)
    idle = make(1)
    post_action(admin_client, "cancel_chats", running + idle)
    assert list(LogEntry.objects.values_list("object_id", "change_message")) == [
        (str(running[0].pk), "Cancellation requested.")
    ]


@pytest.mark.parametrize("action", ["halt_chats", "switch_model"])
def test_a_viewer_cannot_run_the_new_actions(viewer, action):
    chats = make(1, state=ChatState.QUEUED)
    post_action(viewer, action, chats, apply="1", reason="x", model="offline:test")
    assert list(Chat.objects.values_list("halt_reason", "model")) == [("", "scripted:test")]
