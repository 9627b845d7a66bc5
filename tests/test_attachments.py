"""Attachments from ``ask_later`` to the provider: what ``ask_later`` accepts and refuses,
the size limit, the in-memory chat, and the persisted chat (the row keeps them; a fresh
instance reads them back and the provider's request carries them)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from django.test import override_settings

import agentloop
from agentloop import Attachment, ConfigurationError
from agentloop.exceptions import AttachmentError
from agentloop.messages import Message as EngineMessage
from agentloop.models import Chat, Message
from agentloop.providers.openai import OpenAIProvider
from tests.providers.wire import Recorder, registered

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
PDF = b"%PDF-1.4\n%%EOF\n"


@pytest.fixture
def png(tmp_path) -> Path:
    path = tmp_path / "chart.png"
    path.write_bytes(PNG)
    return path


@pytest.fixture
def memory_chat(scripted):
    return agentloop.chat("scripted:test")


# -- the Attachment type -----------------------------------------------------------------------
def test_an_attachment_takes_its_kind_from_the_media_type():
    assert Attachment(data=PDF, media_type="application/pdf").kind == "file"
    assert Attachment(data=PNG, media_type="IMAGE/JPG").kind == "image"


def test_an_attachment_url_gets_its_type_from_the_path():
    attachment = Attachment(url="https://example.com/photos/cat.webp?size=large")

    assert (attachment.kind, attachment.media_type) == ("image", "image/webp")


def test_a_data_url_is_read_into_bytes_and_type():
    attachment = Attachment(url="data:image/png;base64," + base64.b64encode(PNG).decode())

    assert (attachment.url, attachment.data, attachment.media_type) == (None, PNG, "image/png")


def test_an_attachment_in_json_carries_its_bytes_as_base64():
    attachment = Attachment(data=PNG, media_type="image/png", name="chart.png")

    dumped = json.loads(attachment.model_dump_json())

    assert dumped["data"] == base64.b64encode(PNG).decode()
    assert Attachment.model_validate_json(attachment.model_dump_json()) == attachment


def test_an_unsupported_media_type_is_refused_with_the_supported_ones_named():
    with pytest.raises(AttachmentError, match=r"'application/zip'.*application/pdf, image/gif"):
        Attachment(data=b"PK", media_type="application/zip", name="a.zip")


def test_bytes_without_a_media_type_are_refused():
    with pytest.raises(AttachmentError, match="give its media_type"):
        Attachment(data=PNG)


def test_a_url_of_unknown_type_needs_its_media_type_or_kind():
    with pytest.raises(AttachmentError, match="Can't tell the type"):
        Attachment(url="https://example.com/render?id=4")

    assert Attachment(url="https://example.com/render?id=4", kind="image").media_type is None


def test_a_kind_that_contradicts_the_media_type_is_refused():
    with pytest.raises(AttachmentError, match="not a image"):
        Attachment(data=PDF, media_type="application/pdf", kind="image")


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(AttachmentError, match="not http"):
        Attachment(url="file:///etc/passwd.png")


# -- ask_later's attachments (in memory) -------------------------------------------------------
def test_ask_later_reads_a_path_and_guesses_its_type(memory_chat, png):
    memory_chat.ask_later("What does the chart show?", attachments=[png])

    (message,) = memory_chat.messages
    assert message.attachments == [
        Attachment(kind="image", data=PNG, media_type="image/png", name="chart.png")
    ]


def test_ask_later_takes_one_attachment_without_a_list(memory_chat):
    memory_chat.ask_later("And this?", attachments="https://example.com/cat.jpg")

    assert memory_chat.messages[0].attachments[0].url == "https://example.com/cat.jpg"


def test_ask_later_takes_attachment_objects_and_urls_together(memory_chat):
    pdf = Attachment.from_bytes(PDF, "application/pdf", name="report.pdf")

    memory_chat.ask_later("Compare", attachments=[pdf, "https://example.com/cat.jpg"])

    assert [a.kind for a in memory_chat.messages[0].attachments] == ["file", "image"]


def test_the_in_memory_chat_sends_the_attachments_to_the_provider(memory_chat, scripted, png):
    scripted.add("A rising line.")

    answer = memory_chat.ask("What does the chart show?", attachments=[png])

    assert answer.content == "A rising line."
    (sent,) = scripted.requests[0].messages
    assert (sent.content, sent.attachments[0].data) == ("What does the chart show?", PNG)


def test_a_string_is_never_read_as_a_path(memory_chat, png):
    with pytest.raises(AttachmentError, match="pathlib.Path"):
        memory_chat.ask_later("look", attachments=[str(png)])

    assert memory_chat.messages == []


def test_bytes_alone_are_refused_for_want_of_a_media_type(memory_chat):
    with pytest.raises(AttachmentError, match="media_type"):
        memory_chat.ask_later("look", attachments=[PNG])


def test_an_unsupported_file_is_refused_before_anything_is_written(memory_chat, tmp_path):
    archive = tmp_path / "data.zip"
    archive.write_bytes(b"PK\x03\x04")

    with pytest.raises(AttachmentError, match="Unsupported attachment type 'application/zip'"):
        memory_chat.ask_later("unpack this", attachments=[archive])

    assert memory_chat.messages == []


def test_attachment_errors_are_configuration_errors(memory_chat):
    with pytest.raises(ConfigurationError):
        memory_chat.ask_later("look", attachments=[object()])


@override_settings(AGENTLOOP={"MAX_ATTACHMENT_BYTES": 10})
def test_a_file_over_the_size_limit_is_refused(memory_chat, png):
    with pytest.raises(AttachmentError, match=r"chart.png is 72 bytes; .* at most 10"):
        memory_chat.ask_later("look", attachments=[png])

    assert memory_chat.messages == []


@override_settings(AGENTLOOP={"MAX_ATTACHMENT_BYTES": 10})
def test_bytes_over_the_size_limit_are_refused(memory_chat):
    with pytest.raises(AttachmentError, match="MAX_ATTACHMENT_BYTES"):
        memory_chat.ask_later(
            "look", attachments=[Attachment(data=PDF, media_type="application/pdf")]
        )


@override_settings(AGENTLOOP={"MAX_ATTACHMENT_BYTES": 10})
def test_a_url_is_not_counted_against_the_size_limit(memory_chat):
    memory_chat.ask_later("look", attachments=["https://example.com/huge.png"])

    assert len(memory_chat.messages[0].attachments) == 1


@override_settings(AGENTLOOP={"MAX_ATTACHMENT_BYTES": None})
def test_no_size_limit_when_the_setting_is_none(memory_chat, png):
    memory_chat.ask_later("look", attachments=[png])

    assert memory_chat.messages[0].attachments[0].size == len(PNG)


# -- the persisted chat ------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_user_row_keeps_the_attachment_with_its_bytes_in_base64(user, png):
    chat = Chat.objects.create(model="scripted:test", owner=user)

    chat.ask_later("What does the chart show?", attachments=[png])

    row = Message.objects.get(chat=chat)
    assert row.attachments == [
        {
            "kind": "image",
            "data": base64.b64encode(PNG).decode(),
            "media_type": "image/png",
            "name": "chart.png",
        }
    ]


@pytest.mark.django_db
def test_a_fresh_chat_reads_the_attachment_back(user, png):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("What does the chart show?", attachments=[png, "https://example.com/b.pdf"])

    messages = Chat.objects.get(pk=chat.pk).conversation.messages

    assert messages[0].attachments == [
        Attachment(kind="image", data=PNG, media_type="image/png", name="chart.png"),
        Attachment(kind="file", url="https://example.com/b.pdf", media_type="application/pdf"),
    ]


@pytest.mark.django_db
def test_messages_without_attachments_read_back_with_an_empty_list(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add("Hi.")
    chat.ask("Hello")

    messages = Chat.objects.get(pk=chat.pk).conversation.messages

    assert [m.attachments for m in messages] == [[], []]
    assert list(Message.objects.filter(chat=chat).values_list("attachments", flat=True)) == [[], []]


@pytest.mark.django_db
def test_a_persisted_attachment_reaches_the_providers_wire_body(user, png):
    """Path in, row written, a fresh instance steps: the HTTP body carries the image."""
    answer = {
        "id": "chatcmpl-1",
        "model": "gpt-4.1-mini",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Up."},
            }
        ],
        "usage": {"prompt_tokens": 90, "completion_tokens": 2},
    }
    recorder = Recorder(httpx.Response(200, json=answer))
    provider = OpenAIProvider(api_key="test-key", transport=recorder.transport())
    with registered("vision", provider):
        chat = Chat.objects.create(model="vision:gpt-4.1-mini", owner=user)
        chat.ask_later("Which way does the line go?", attachments=[png])

        reply = Chat.objects.get(pk=chat.pk).step()

    assert reply.content == "Up."
    (body,) = recorder.bodies
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Which way does the line go?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
                },
            ],
        }
    ]


@pytest.mark.django_db
def test_a_refused_attachment_writes_no_row(user):
    chat = Chat.objects.create(model="scripted:test", owner=user)

    with pytest.raises(AttachmentError):
        chat.ask_later("look", attachments=["ftp://example.com/a.png"])

    assert not Message.objects.filter(chat=chat).exists()


def test_an_engine_message_has_no_attachments_by_default():
    assert EngineMessage(role="user", content="hi").attachments == []
