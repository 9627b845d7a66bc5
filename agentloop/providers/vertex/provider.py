"""``VertexAIProvider``: Gemini on Google Cloud's Vertex AI, with OAuth bearer tokens."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ...exceptions import ConfigurationError, InvalidResponseError
from ...messages import ModelRequest, ModelResponse
from ..base import AsyncChunkCallback
from ..errors import call_errors
from ..gemini import GeminiBase
from .credentials import GoogleCredentials

__all__ = ["VertexAIProvider"]

PROJECT_ENV = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT")
LOCATION_ENV = ("GOOGLE_CLOUD_LOCATION",)
GLOBAL_HOST = "https://aiplatform.googleapis.com"


def _first_env(variables: tuple[str, ...]) -> str | None:
    return next((os.environ[v] for v in variables if os.environ.get(v)), None)


class VertexAIProvider(GeminiBase):
    """Gemini through Vertex AI (``publishers/google/models/{model}:generateContent``).

    Settings (``AGENTLOOP["PROVIDERS"]["vertexai"]``), each also a constructor argument:
    ``project`` (else ``GOOGLE_CLOUD_PROJECT``, else the credentials' project), ``location``
    (else ``GOOGLE_CLOUD_LOCATION``; ``global`` or a region such as ``europe-west4``),
    ``credentials`` (a credentials file's path, or a google-auth ``Credentials`` object;
    None: Application Default Credentials), ``endpoint_url`` (another host: a private
    endpoint or a gateway), ``api_version`` (default ``v1beta1``), ``timeout``, ``headers``.
    Tokens come from google-auth and are never stored on a chat, logged, or shown.
    """

    name = "vertexai"
    default_api_version = "v1beta1"
    requires_key = False  # OAuth bearer tokens from google-auth, never an API key

    def __init__(
        self,
        *,
        project: str | None = None,
        location: str | None = None,
        credentials: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._project = project
        self._location = location
        self._credentials = credentials
        self._google = GoogleCredentials(self.name, self._credentials_source, lambda: self.client)

    def __repr__(self) -> str:
        # Nothing is resolved here (no credentials loaded, nothing that could fail).
        return f"<{type(self).__name__} name={self.name!r} location={self._given_location()!r}>"

    # -- configuration -------------------------------------------------------------------
    def _credentials_source(self) -> Any:
        """The ``credentials`` argument, else the setting (None: ADC)."""
        return self._credentials if self._credentials is not None else self._setting("credentials")

    def _given_location(self) -> str | None:
        return self._location or self._setting("location") or _first_env(LOCATION_ENV)

    def _given_project(self) -> str | None:
        return self._project or self._setting("project") or _first_env(PROJECT_ENV)

    def configuration_problems(self) -> list[str]:
        """What would stop every call (for the system check): no location, or no project
        in the settings, the environment or the credentials (loaded for that, when needed,
        once a location is known: google-auth's requests go to the location's host)."""
        problems: list[str] = []
        if not self._given_location():
            problems.append(self._missing("location"))
            if not self._given_project():
                problems.append(self._missing("project"))
            return problems
        try:
            self.project  # noqa: B018 - resolving it is the check
        except ConfigurationError as exc:
            problems.append(str(exc))
        return problems

    @property
    def location(self) -> str:
        """The location (``global`` or a region), or ConfigurationError saying where to set it."""
        location = self._given_location()
        if not location:
            raise ConfigurationError(self._missing("location"))
        return str(location)

    def _missing(self, what: str) -> str:
        setting = f"AGENTLOOP['PROVIDERS'][{self.name!r}][{what!r}]"
        if what == "location":
            return (
                f"No Vertex AI location for provider {self.name!r}: set {setting} (e.g. "
                "'global' or 'us-central1') or the GOOGLE_CLOUD_LOCATION environment variable."
            )
        return (
            f"No Google Cloud project for provider {self.name!r}: set {setting} or the "
            "GOOGLE_CLOUD_PROJECT environment variable (the credentials name none)."
        )

    @property
    def project(self) -> str:
        """The project: the setting, else the environment, else the credentials' own."""
        project = self._given_project() or self._google.project()
        if not project:
            raise ConfigurationError(self._missing("project"))
        return str(project)

    @property
    def base_url(self) -> str:
        """``endpoint_url`` (or ``base_url``) when given, else the location's host: the
        ``global`` location is served by aiplatform.googleapis.com, a region by
        ``{region}-aiplatform.googleapis.com``."""
        given = self._configured_url()  # checked, as every HTTP provider's
        if given:
            return given.rstrip("/")
        location = self.location
        if location == "global":
            return GLOBAL_HOST
        return f"https://{location}-aiplatform.googleapis.com"

    # -- HTTP -------------------------------------------------------------------------------
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._google.token()}"}

    def credential_secrets(self) -> tuple[str, ...]:
        """The OAuth token and the credentials' own secrets (the proxy's, the key's and the
        headers' are every family's: ``HTTPProvider._secrets``)."""
        return self._google.secrets()

    def _resource(self, model: str) -> str:
        """The model's path: a publisher model by id, or a path below the location as given
        (``endpoints/123`` for a tuned model's endpoint)."""
        if model.startswith("projects/"):
            return model
        relative = model if "/" in model else f"publishers/google/models/{model}"
        return f"projects/{self.project}/locations/{self.location}/{relative}"

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        return f"/{self.api_version}/{self._resource(request.model)}:{self.action(stream)}"

    async def arequest(
        self, request: ModelRequest, *, on_chunk: AsyncChunkCallback | None = None
    ) -> ModelResponse:
        """``request()`` for async verbs; a token refresh (blocking HTTP in google-auth) runs
        on a thread first, so the event loop only ever reads a fresh token."""
        with call_errors(self.name, self._secrets):  # a refused refresh is redacted too
            await asyncio.to_thread(self._google.token)
        return await super().arequest(request, on_chunk=on_chunk)

    # -- counting tokens -----------------------------------------------------------------------
    def count_tokens(self, request: ModelRequest) -> int:
        """The prompt tokens of ``request`` by Vertex AI's ``:countTokens`` (no generation, not
        billed): its contents, system instruction and tools."""
        body = self.build_body(request, stream=False)
        counted = {k: v for k, v in body.items() if k in ("contents", "systemInstruction", "tools")}
        path = f"/{self.api_version}/{self._resource(request.model)}:countTokens"
        with call_errors(self.name, self._secrets) as sent:
            post = sent({"url": path, "json": counted, "headers": self._headers_for(request)})
            response = self.client.post(**post)
            self._raise_for_status(response)
        try:
            total = response.json()["totalTokens"]
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidResponseError(
                f"{self.name} answered :countTokens without totalTokens"
            ) from exc
        if isinstance(total, bool) or not isinstance(total, int):
            raise InvalidResponseError(f"{self.name} answered :countTokens with {total!r} tokens")
        return total
