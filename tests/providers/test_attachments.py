"""Attachments on the wire: each provider's request body for an image by URL, an image as
bytes, a PDF (bytes, and by URL where the API takes one) and a tool result carrying an
image. Bodies are built with ``build_body`` (the same code ``request`` sends)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from agentloop.exceptions import AttachmentError
from agentloop.messages import Attachment, Message, ModelRequest, ToolCall
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OllamaProvider, OpenAIProvider, OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PNG_B64 = base64.b64encode(PNG).decode()
PDF = b"%PDF-1.4\n1 0 obj << >> endobj\n%%EOF\n"
PDF_B64 = base64.b64encode(PDF).decode()
IMAGE_URL = "https://example.com/cat.jpg"
PDF_URL = "https://example.com/report.pdf"

IMAGE_BY_URL = Attachment(url=IMAGE_URL)
IMAGE_BYTES = Attachment(data=PNG, media_type="image/png")
PDF_BYTES = Attachment(data=PDF, media_type="application/pdf", name="report.pdf")
PDF_BY_URL = Attachment(url=PDF_URL)


def request(*attachments: Attachment, content: str = "What is this?") -> ModelRequest:
    return ModelRequest(
        model="m",
        messages=[Message(role="user", content=content, attachments=list(attachments))],
    )


def tool_round(*attachments: Attachment) -> ModelRequest:
    call = ToolCall(id="call_1", name="snapshot", arguments={})
    return ModelRequest(
        model="m",
        messages=[
            Message(role="user", content="Take a snapshot"),
            Message(role="assistant", tool_calls=[call]),
            Message(
                role="tool",
                content="Here it is",
                tool_call_id="call_1",
                tool_name="snapshot",
                attachments=list(attachments),
            ),
        ],
    )


def chat_completions(provider: OpenAIProvider, req: ModelRequest) -> Any:
    return provider.build_body(req, False)["messages"][-1]["content"]


# -- OpenAI Chat Completions (OpenAI, OpenRouter, Ollama) --------------------------------------
def test_chat_completions_sends_an_image_url_as_an_image_url_part():
    content = chat_completions(OpenAIProvider(api_key="k"), request(IMAGE_BY_URL))

    assert content == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": IMAGE_URL}},
    ]


def test_chat_completions_sends_image_bytes_as_a_data_url_with_its_detail():
    image = IMAGE_BYTES.model_copy(update={"detail": "low"})

    content = chat_completions(OpenAIProvider(api_key="k"), request(image))

    assert content[1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PNG_B64}", "detail": "low"},
    }


def test_chat_completions_sends_a_pdf_as_a_file_part_with_file_data():
    content = chat_completions(OpenAIProvider(api_key="k"), request(PDF_BYTES))

    assert content[1] == {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{PDF_B64}"},
    }


def test_chat_completions_names_an_unnamed_pdf():
    pdf = Attachment(data=PDF, media_type="application/pdf")

    content = chat_completions(OpenAIProvider(api_key="k"), request(pdf))

    assert content[1]["file"]["filename"] == "document.pdf"


def test_chat_completions_refuses_a_pdf_by_url_where_the_server_reads_no_file_urls():
    with pytest.raises(AttachmentError, match="bytes, not by URL"):
        OpenAIProvider(api_key="k").build_body(request(PDF_BY_URL), False)


def test_openrouter_sends_a_pdf_url_as_file_data():
    content = chat_completions(OpenRouterProvider(api_key="k"), request(PDF_BY_URL))

    assert content[1] == {
        "type": "file",
        "file": {"filename": "document.pdf", "file_data": PDF_URL},
    }


def test_chat_completions_keeps_plain_text_content_without_attachments():
    body = OllamaProvider().build_body(request(), False)

    assert body["messages"] == [{"role": "user", "content": "What is this?"}]


def test_chat_completions_sends_attachments_alone_without_an_empty_text_part():
    content = chat_completions(OpenAIProvider(api_key="k"), request(IMAGE_BY_URL, content=""))

    assert content == [{"type": "image_url", "image_url": {"url": IMAGE_URL}}]


def test_chat_completions_sends_a_tool_results_image_as_content_parts():
    body = OllamaProvider().build_body(tool_round(IMAGE_BYTES), False)

    assert body["messages"][-1] == {
        "role": "tool",
        "content": [
            {"type": "text", "text": "Here it is"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
        ],
        "tool_call_id": "call_1",
    }


# -- OpenAI Responses --------------------------------------------------------------------------
def responses_content(req: ModelRequest) -> Any:
    return OpenAIResponsesProvider(api_key="k").build_body(req, False)["input"][-1]


def test_responses_sends_an_image_url_as_input_image():
    item = responses_content(request(IMAGE_BY_URL))

    assert item == {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "auto"},
        ],
    }


def test_responses_sends_image_bytes_as_a_data_url():
    part = responses_content(request(IMAGE_BYTES))["content"][1]

    assert part == {
        "type": "input_image",
        "image_url": f"data:image/png;base64,{PNG_B64}",
        "detail": "auto",
    }


def test_responses_sends_a_pdf_as_input_file_with_file_data_and_filename():
    part = responses_content(request(PDF_BYTES))["content"][1]

    assert part == {
        "type": "input_file",
        "filename": "report.pdf",
        "file_data": f"data:application/pdf;base64,{PDF_B64}",
    }


def test_responses_sends_a_pdf_url_as_file_url():
    part = responses_content(request(PDF_BY_URL))["content"][1]

    assert part == {"type": "input_file", "file_url": PDF_URL}


def test_responses_sends_a_tool_results_image_in_the_output_list():
    item = responses_content(tool_round(IMAGE_BY_URL))

    assert item == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [
            {"type": "input_text", "text": "Here it is"},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "auto"},
        ],
    }


# -- Anthropic ---------------------------------------------------------------------------------
def anthropic_blocks(req: ModelRequest) -> Any:
    return AnthropicProvider(api_key="k").build_body(req, False)["messages"][-1]["content"]


def test_anthropic_sends_an_image_url_as_an_image_block_with_a_url_source():
    assert anthropic_blocks(request(IMAGE_BY_URL)) == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
    ]


def test_anthropic_sends_image_bytes_as_a_base64_source():
    block = anthropic_blocks(request(IMAGE_BYTES))[1]

    assert block == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
    }


def test_anthropic_sends_a_pdf_as_a_document_block_titled_by_its_name():
    block = anthropic_blocks(request(PDF_BYTES))[1]

    assert block == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64},
        "title": "report.pdf",
    }


def test_anthropic_sends_a_pdf_url_as_a_document_with_a_url_source():
    block = anthropic_blocks(request(PDF_BY_URL))[1]

    assert block == {"type": "document", "source": {"type": "url", "url": PDF_URL}}


def test_anthropic_sends_a_tool_results_image_inside_the_tool_result():
    result = anthropic_blocks(tool_round(IMAGE_BYTES))[0]

    assert result == {
        "type": "tool_result",
        "tool_use_id": "call_1",
        "content": [
            {"type": "text", "text": "Here it is"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
            },
        ],
    }


# -- Gemini ------------------------------------------------------------------------------------
def gemini_parts(req: ModelRequest) -> Any:
    return GeminiProvider(api_key="k").build_body(req, False)["contents"][-1]["parts"]


def test_gemini_sends_an_image_url_as_file_data_with_its_type():
    assert gemini_parts(request(IMAGE_BY_URL)) == [
        {"text": "What is this?"},
        {"fileData": {"fileUri": IMAGE_URL, "mimeType": "image/jpeg"}},
    ]


def test_gemini_sends_image_bytes_as_inline_data():
    part = gemini_parts(request(IMAGE_BYTES))[1]

    assert part == {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}


def test_gemini_sends_a_pdf_as_inline_data():
    part = gemini_parts(request(PDF_BYTES))[1]

    assert part == {"inlineData": {"mimeType": "application/pdf", "data": PDF_B64}}


def test_gemini_sends_a_pdf_url_as_file_data():
    part = gemini_parts(request(PDF_BY_URL))[1]

    assert part == {"fileData": {"fileUri": PDF_URL, "mimeType": "application/pdf"}}


def test_gemini_sends_a_tool_results_image_after_its_function_response():
    parts = gemini_parts(tool_round(IMAGE_BYTES))

    assert [next(iter(part)) for part in parts] == ["functionResponse", "inlineData"]
    assert parts[1] == {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}
