"""``GeminiProvider``: the Gemini API (Google AI Studio keys) over HTTP."""

from __future__ import annotations

from ...messages import ModelRequest
from .base import GeminiBase

__all__ = ["GeminiProvider"]

DEFAULT_API_VERSION = "v1beta"


class GeminiProvider(GeminiBase):
    """Gemini through the Gemini API (Google AI Studio keys).

    Settings (``AGENTLOOP["PROVIDERS"]["gemini"]``): ``api_key`` (else the
    ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY`` environment variable), ``base_url``
    (without the version), ``api_version`` (default ``v1beta``), ``timeout``, ``headers``.
    """

    name = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    default_api_version = DEFAULT_API_VERSION
    api_key_env = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        model = request.model
        resource = model if "/" in model else f"models/{model}"  # tunedModels/... as given
        return f"/{self.api_version}/{resource}:{self.action(stream)}"
