"""Serving recorded Vertex AI traffic: the OAuth token exchange and the API calls, each from
its own queue (a provider refreshes its token when it must, not once per recorded chat),
through one ``httpx.MockTransport`` that keeps what was sent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
from google.oauth2.credentials import Credentials

from agentloop.providers.vertex import VertexAIProvider
from tests.providers.cassettes import Interaction

#: what the recordings' placeholders stand for here. The recorded host is
#: aiplatform.googleapis.com, with no region before it: the recordings were made in the
#: ``global`` location (a region's host is {region}-aiplatform.googleapis.com).
PROJECT = "test-project"
LOCATION = "global"
TOKEN_URI = "https://oauth2.googleapis.com/token"
#: the recordings' access token (a placeholder, as the token endpoint's answer has it).
ACCESS_TOKEN = "<GOOGLE_ACCESS_TOKEN>"


def user_credentials() -> Credentials:
    """Authorized-user credentials (``gcloud auth application-default login`` makes these)
    holding the recordings' placeholders: refreshing them posts the recorded form."""
    return Credentials(
        token=None,
        refresh_token="<GOOGLE_REFRESH_TOKEN>",
        client_id="<GOOGLE_CLIENT_ID>",
        client_secret="<GOOGLE_CLIENT_SECRET>",
        token_uri=TOKEN_URI,
    )


def user_file(folder: Path, **extra: Any) -> str:
    """The path of an authorized user's credentials file in ``folder`` (as ``gcloud auth
    application-default login`` writes it; loading it needs no network), with the
    recordings' placeholders, and ``extra`` fields (``quota_project_id``)."""
    info = {
        "type": "authorized_user",
        "client_id": "<GOOGLE_CLIENT_ID>",
        "client_secret": "<GOOGLE_CLIENT_SECRET>",
        "refresh_token": "<GOOGLE_REFRESH_TOKEN>",
        **extra,
    }
    path = folder / "adc.json"
    path.write_text(json.dumps(info))
    return str(path)


def recorded_url(interaction: Interaction) -> str:
    return interaction.uri.replace("<GOOGLE_CLOUD_PROJECT>", PROJECT).replace(
        "<GOOGLE_CLOUD_LOCATION>", LOCATION
    )


def is_token_exchange(interaction: Interaction) -> bool:
    return interaction.uri == TOKEN_URI


def form(text: str) -> dict[str, list[str]]:
    return parse_qs(text, strict_parsing=True)


def recorded_response(recorded: Interaction) -> httpx.Response:
    dropped = {"content-encoding", "transfer-encoding", "content-length"}
    headers = {
        key: ", ".join(values)
        for key, values in recorded.response_headers.items()
        if key.lower() not in dropped
    }
    return httpx.Response(recorded.status, headers=headers, content=recorded.response_text.encode())


@dataclass
class VertexServer:
    """Answers token exchanges and API calls from their own queues, in order."""

    tokens: list[Any]  # an Interaction, or an httpx.Response made by the test
    calls: list[Any]
    sent: list[httpx.Request] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        interactions: list[Interaction],
        *extra: httpx.Response,
        tokens: tuple[httpx.Response, ...] = (),
    ) -> VertexServer:
        """Served ``interactions``, then ``extra`` API answers and ``tokens`` exchanges."""
        recorded = [i for i in interactions if is_token_exchange(i)]
        calls = [i for i in interactions if not is_token_exchange(i)]
        return cls([*recorded, *tokens], [*calls, *extra])

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        queue = self.tokens if str(request.url) == TOKEN_URI else self.calls
        if not queue:
            raise AssertionError(f"unexpected request to {request.url}")
        answer = queue.pop(0)
        return answer if isinstance(answer, httpx.Response) else recorded_response(answer)

    @property
    def token_requests(self) -> list[httpx.Request]:
        return [r for r in self.sent if str(r.url) == TOKEN_URI]

    @property
    def api_requests(self) -> list[httpx.Request]:
        return [r for r in self.sent if str(r.url) != TOKEN_URI]

    def api_bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.api_requests]


def serving(
    interactions: list[Interaction],
    *extra: httpx.Response,
    tokens: tuple[httpx.Response, ...] = (),
    **options: Any,
) -> tuple[VertexAIProvider, VertexServer]:
    """A VertexAIProvider (the test project, ``global``, authorized-user credentials) served
    by ``interactions``, then ``extra`` API answers and ``tokens`` token exchanges."""
    server = VertexServer.of(interactions, *extra, tokens=tokens)
    options.setdefault("credentials", user_credentials())
    provider = VertexAIProvider(
        project=PROJECT, location=LOCATION, transport=httpx.MockTransport(server), **options
    )
    return provider, server
