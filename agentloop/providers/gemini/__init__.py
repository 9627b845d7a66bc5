"""Google Gemini API (``generateContent`` / ``streamGenerateContent``), plain and streamed.

Mapping, in short: system messages become ``systemInstruction`` parts; user text is a
``user`` content, assistant answers are ``model`` contents of text and ``functionCall``
parts; the results of one round go back as one ``user`` content of ``functionResponse``
parts (matched by function name, and by id when Gemini gave the call one). Tools are
``functionDeclarations`` whose parameters are translated from JSON Schema into Gemini's
OpenAPI dialect (upper-case types, ``nullable``); a schema that dialect can't express is
sent as ``parametersJsonSchema`` instead. Structured output is JSON mode with the same
translation (``responseSchema``, else ``responseJsonSchema``). Attachments follow a
message's text as ``inlineData`` (bytes, base64) or ``fileData`` (``fileUri``: a URL)
parts; a tool result's attachments follow its ``functionResponse`` in the same content.

Gemini (before Gemini 3) sends calls without ids: each call gets one of ours, and the
vendor's id, when there is one, is kept in ``ToolCall.provider_data``. Thought signatures
are kept on the call (``thought_signature``) or, for signed text and thought parts, in the
assistant message's ``provider_data["gemini_parts"]``, and sent back on the same parts.

The package: ``base`` (``GeminiBase``: the wire format over HTTP and Google's errors, shared
with ``agentloop.providers.vertex``), ``provider`` (``GeminiProvider``: the Gemini API's URL
and key), ``mapping`` (the request body and the answers) and ``schema`` (JSON Schema in
Gemini's dialect).
"""

from .base import GeminiBase
from .mapping import CALL_ID, PARTS_KEY, SIGNATURE
from .provider import GeminiProvider
from .schema import gemini_schema

__all__ = [
    "CALL_ID",
    "PARTS_KEY",
    "SIGNATURE",
    "GeminiBase",
    "GeminiProvider",
    "gemini_schema",
]
