"""Replaying the recorded provider traffic in ../shared/fixtures/providers/ (read in place).

Each cassette is VCR YAML: a list of interactions with the exact request and the
response (streamed ones keep the raw SSE text). ``Cassette.transport()`` serves the
responses in order through ``httpx.MockTransport`` and keeps the requests we sent,
so a test can compare our request body with the recorded one.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(
    os.environ.get("AGENTLOOP_FIXTURES", REPO.parent / "shared" / "fixtures" / "providers")
)


def require_fixtures() -> Path:
    """The fixtures folder; skips (or fails under CI=true) when it is absent."""
    if not FIXTURES.is_dir():
        reason = f"recorded provider traffic not found at {FIXTURES} (set AGENTLOOP_FIXTURES)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return FIXTURES


@dataclass
class Interaction:
    method: str
    uri: str
    request_body: Any
    request_headers: dict[str, list[str]]
    status: int
    response_headers: dict[str, list[str]]
    response_text: str

    @property
    def is_stream(self) -> bool:
        content_type = " ".join(self.response_headers.get("Content-Type", []))
        return "event-stream" in content_type or self.response_text.lstrip().startswith(
            ("data:", "event:")
        )

    def response_json(self) -> Any:
        return json.loads(self.response_text)


@dataclass
class Cassette:
    name: str
    interactions: list[Interaction]
    sent: list[httpx.Request] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        """Serves the recorded responses in order; records what we send."""
        queue = list(self.interactions)

        def handle(request: httpx.Request) -> httpx.Response:
            self.sent.append(request)
            if not queue:
                raise AssertionError(f"{self.name}: more requests than recorded interactions")
            recorded = queue.pop(0)
            headers = {key: ", ".join(values) for key, values in recorded.response_headers.items()
                       if key.lower() not in {"content-encoding", "transfer-encoding",
                                               "content-length"}}  # fmt: skip
            return httpx.Response(
                recorded.status, headers=headers, content=recorded.response_text.encode("utf-8")
            )

        return httpx.MockTransport(handle)

    def sent_bodies(self) -> list[Any]:
        return [json.loads(request.content) if request.content else None for request in self.sent]


def _body(raw: dict[str, Any] | None) -> str:
    if not raw:
        return ""
    return raw.get("string") or ""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads Ruby's ``!binary`` (base64) strings."""


def _binary(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    raw = base64.b64decode(loader.construct_scalar(node))  # type: ignore[arg-type]
    return raw.decode("utf-8", errors="replace")


_Loader.add_constructor("!binary", _binary)


def _json_or_text(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # e.g. a JSONL batch upload


def load(name: str) -> Cassette:
    """Load ``name`` (file name with or without .yml) from the fixtures folder."""
    folder = require_fixtures()
    path = folder / (name if name.endswith(".yml") else f"{name}.yml")
    data = yaml.load(path.read_text("utf-8"), Loader=_Loader)  # noqa: S506 - safe loader subclass
    interactions = []
    for item in data.get("http_interactions", []):
        request, response = item["request"], item["response"]
        text = _body(request.get("body"))
        interactions.append(
            Interaction(
                method=request["method"].upper(),
                uri=request["uri"],
                request_body=_json_or_text(text),
                request_headers=request.get("headers") or {},
                status=int(response["status"]["code"]),
                response_headers=response.get("headers") or {},
                response_text=_body(response.get("body")),
            )
        )
    return Cassette(path.stem, interactions)


def names(part: str) -> list[str]:
    """Cassette names containing ``part`` (empty when the folder is absent)."""
    if not FIXTURES.is_dir():
        return []
    return sorted(path.stem for path in FIXTURES.glob("*.yml") if part in path.name)
