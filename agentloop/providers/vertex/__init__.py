"""Google Vertex AI: Gemini models on Google Cloud (``"vertexai:gemini-2.5-flash"``).

The request and the answers are Gemini's (``agentloop.providers.gemini``: one mapping, two
transports); Vertex AI differs in where a request goes
(``/v1beta1/projects/{project}/locations/{location}/publishers/google/models/{model}``, on
``aiplatform.googleapis.com`` for ``global`` and ``{region}-aiplatform.googleapis.com``
otherwise) and in how it is authorised: OAuth bearer tokens from google-auth (the ``vertex``
extra), refreshed before they expire.

The package: ``provider`` (``VertexAIProvider``: settings, URLs, async, token counting),
``credentials`` (loading credentials and refreshing tokens) and ``transport`` (google-auth's
HTTP calls over the provider's httpx client).
"""

from .provider import VertexAIProvider

__all__ = ["VertexAIProvider"]
