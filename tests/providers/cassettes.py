"""Replaying the recorded provider traffic in ../shared/fixtures/providers/ (read in place;
``AGENTLOOP_FIXTURES`` names another ``providers/`` folder, its siblings beside it).

Each cassette is VCR YAML: a list of interactions with the exact request and the
response (streamed ones keep the raw SSE text). ``Cassette.transport()`` serves the
responses in order through ``httpx.MockTransport`` and keeps the requests we sent,
so a test can compare our request body with the recorded one.

Also here, for the replay modules: serving a cassette to a provider (:func:`serve`,
:func:`replay`), reading recorded SSE (:func:`sse_data`), the terminal line "N of M
cassettes pass" (:func:`pass_counts`), and the two questions of the recorded multi-turn
weather conversations (:func:`ask_both`, :func:`stream_both`).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from agentloop.messages import ModelRequest, ModelResponse, TextDelta, ToolCallDelta
from agentloop.models import Chat
from agentloop.models import Message as MessageRow
from agentloop.providers.base import Provider
from tests.tools import RecordedWeather

REPO = Path(__file__).resolve().parents[2]
P = TypeVar("P", bound=Provider)
FIXTURES = Path(
    os.environ.get("AGENTLOOP_FIXTURES", REPO.parent / "shared" / "fixtures" / "providers")
)
#: the newer recordings (thinking, prompt caching), kept apart from FIXTURES.
NEXT = FIXTURES.parent / "providers-next"
#: the recordings of the clouds (Bedrock, Vertex AI, Azure), kept apart from FIXTURES.
CLOUD = FIXTURES.parent / "providers-cloud"


#: under CI=true the recordings must be there (CI always has them): a replay test that
#: skipped there would prove nothing.
IN_CI = os.environ.get("CI") == "true"


def missing(folder: Path) -> str:
    """The one-line reason a test that reads the absent ``folder`` gives: which folder, and
    how to get it."""
    return (
        f"recorded provider traffic not found at {folder}: put the shared/ folder of recordings "
        "beside this clone (../shared/fixtures/) or set AGENTLOOP_FIXTURES to its providers/"
    )


def require_fixtures(folder: Path = FIXTURES) -> Path:
    """The recordings' ``folder``. When it is absent, the calling test (or, while pytest
    imports a module, the whole module) is skipped with the reason :func:`missing` gives,
    except under ``CI=true``, where that fails."""
    if not folder.is_dir():
        if IN_CI:
            pytest.fail(f"{missing(folder)}; under CI=true the replay tests must run")
        pytest.skip(missing(folder), allow_module_level=True)
    return folder


@dataclass
class Interaction:
    method: str
    uri: str
    request_body: Any
    request_headers: dict[str, list[str]]
    status: int
    response_headers: dict[str, list[str]]
    response_text: str
    #: the body's exact bytes (a ``!binary`` body: Bedrock's event-stream frames).
    response_bytes: bytes = b""

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
            content = recorded.response_bytes or recorded.response_text.encode("utf-8")
            return httpx.Response(recorded.status, headers=headers, content=content)

        return httpx.MockTransport(handle)

    def sent_bodies(self) -> list[Any]:
        return [json.loads(request.content) if request.content else None for request in self.sent]


def _body(raw: dict[str, Any] | None) -> str:
    if not raw:
        return ""
    return raw.get("string") or ""


# libyaml's loader where PyYAML was built with it: a tenth of the pure-Python one's time (the
# largest recording, 2 MB, took 19 s of a loaded test run).
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):  # type: ignore[misc,valid-type]
    """A safe loader that also reads Ruby's ``!binary`` (base64) strings."""


class _BinaryText(str):
    """A ``!binary`` body as text (bytes that aren't UTF-8 replaced), its bytes in ``raw``."""

    raw: bytes


def _binary(loader: Any, node: yaml.Node) -> str:
    raw = base64.b64decode(loader.construct_scalar(node))  # type: ignore[arg-type]
    text = _BinaryText(raw.decode("utf-8", errors="replace"))
    text.raw = raw
    return text


_Loader.add_constructor("!binary", _binary)


def _json_or_text(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # e.g. a JSONL batch upload


def load(name: str, folder: Path = FIXTURES) -> Cassette:
    """Load ``name`` (file name with or without .yml) from the fixtures folder."""
    folder = require_fixtures(folder)
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
                response_bytes=getattr(_body(response.get("body")), "raw", b""),
            )
        )
    return Cassette(path.stem, interactions)


def names(part: str, folder: Path = FIXTURES) -> list[str]:
    """Cassette names containing ``part`` (empty when the folder is absent)."""
    if not folder.is_dir():
        return []
    return sorted(path.stem for path in folder.glob("*.yml") if part in path.name)


@cache
def cached(name: str, folder: Path = FIXTURES) -> Cassette:
    """``load(name)`` read once, for reading the recording (serve copies: see :func:`serve`)."""
    return load(name, folder)


# -- serving a recording to a provider ----------------------------------------------------------
def serve(provider_class: type[P], *interactions: Interaction) -> tuple[P, Cassette]:
    """A ``provider_class`` (key "test-key") answered by ``interactions``, and the copy of
    the cassette that serves them and keeps what was sent."""
    replay = Cassette("replay", list(interactions))
    return provider_class(api_key="test-key", transport=replay.transport()), replay


def replay(
    provider_class: type[Provider], interaction: Interaction, request: ModelRequest
) -> tuple[ModelResponse, list[Any]]:
    """The answer ``provider_class`` makes of the recorded one to ``request``, and the chunks
    it streamed (when ``request`` streams)."""
    provider, _ = serve(provider_class, interaction)
    chunks: list[Any] = []
    response = provider.request(request, on_chunk=chunks.append if request.stream else None)
    return response, chunks


def continued(interactions: list[Interaction], field: str) -> list[int]:
    """Indexes k of answered requests whose conversation (the list ``field`` of the body) the
    next recorded request repeats and extends: it carries request k's answer."""
    found = []
    for k in range(len(interactions) - 1):
        before = interactions[k].request_body[field]
        after = interactions[k + 1].request_body[field]
        if (
            interactions[k].status == 200
            and len(after) > len(before)
            and after[: len(before)] == before
        ):
            found.append(k)
    return found


def sse_data(text: str) -> list[Any]:
    """The JSON payloads of a recorded SSE body, an independent, simple reading: each
    ``data:`` line but empty ones and ``[DONE]``."""
    return [
        json.loads(line[len("data:") :])
        for line in text.splitlines()
        if line.startswith("data:") and line[len("data:") :].strip() not in ("", "[DONE]")
    ]


# -- "N of M cassettes pass" --------------------------------------------------------------------
class PassCounts:
    """Adds "<label>: N of M cassettes pass" to the terminal summary, under ``title``.

    The cassette of a test is its id (``test_x[<cassette>]``) in ``module``; a cassette
    passes when every test of it passed (an xfail does not pass). ``label`` names the
    cassette's group: one text, or a function of the cassette's name.
    """

    def __init__(self, module: str, title: str, label: str | Callable[[str], str]) -> None:
        self.file = f"{module.rpartition('.')[2]}.py::"
        self.title = title
        self.label = label if callable(label) else lambda name: label
        self.results: dict[str, bool] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.file not in report.nodeid or "[" not in report.nodeid:
            return
        name = report.nodeid.rpartition("[")[2].rstrip("]")
        # a skip (of the test, of its set-up: the recordings absent) or an xfail doesn't pass
        failed = report.failed or report.skipped
        self.results[name] = self.results.get(name, True) and not failed

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results:
            return
        groups: dict[str, list[bool]] = {}
        for name, passed in self.results.items():
            groups.setdefault(self.label(name), []).append(passed)
        terminalreporter.section(self.title)
        for label, outcomes in groups.items():
            terminalreporter.write_line(
                f"{label}: {sum(outcomes)} of {len(outcomes)} cassettes pass"
            )


def pass_counts(module: str, title: str, label: str | Callable[[str], str]) -> Any:
    """A module-scoped autouse fixture registering a :class:`PassCounts` once per session;
    assign it to a name in the test module (``_pass_counts = pass_counts(__name__, ...)``)."""

    @pytest.fixture(scope="module", autouse=True)
    def _pass_counts(request: pytest.FixtureRequest) -> None:
        manager = request.config.pluginmanager
        plugin = f"agentloop-pass-counts-{module}"
        if not manager.has_plugin(plugin):
            manager.register(PassCounts(module, title, label), plugin)

    return _pass_counts


# -- the recorded multi-turn weather conversations ----------------------------------------------
#: what the person asks in the recorded multi-turn weather conversations, in order.
WEATHER_QUESTIONS = (
    "What's the weather in Berlin? (52.5200, 13.4050)",
    "What's the weather in Paris? (48.8575, 2.3514)",
)


def weather_chat(model: str, owner: Any) -> Chat:
    """A persisted chat of ``model`` with the recorded conversations' weather tool."""
    chat = Chat.objects.create(model=model, owner=owner)
    chat.with_tools(RecordedWeather)
    return chat


def ask_both(chat: Chat) -> list[MessageRow]:
    """The chat's answers to both questions, asked one after the other."""
    return [chat.ask(question) for question in WEATHER_QUESTIONS]


def stream_both(chat: Chat) -> list[tuple[MessageRow, list[Any]]]:
    """The chat's answers to both questions, each with the chunks streamed for it."""
    answers = []
    for question in WEATHER_QUESTIONS:
        chunks: list[Any] = []
        answers.append((chat.ask(question, stream=chunks.append), chunks))
    return answers


def assert_each_answer_was_streamed(answers: list[tuple[MessageRow, list[Any]]]) -> None:
    """Each answer is the text streamed for it (the answer after a tool round is the text
    streamed after the tool call), and one tool call was streamed in its turn."""
    for answer, chunks in answers:
        assert answer.content == "".join(c.text for c in chunks if isinstance(c, TextDelta))
        assert sum(isinstance(c, ToolCallDelta) and c.id is not None for c in chunks) == 1


def assert_two_complete_rounds(chat: Chat) -> list[MessageRow]:
    """``chat`` holds two complete tool rounds; returns its rows."""
    rows = list(chat.messages.order_by("id"))
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"] * 2
    assert all(m.status == "complete" for m in rows)
    return rows


def assert_claude_answered_both(
    chat: Chat, answers: list[MessageRow], call_ids: tuple[str, str]
) -> list[MessageRow]:
    """What Claude Haiku 4.5's recorded answers to both questions leave in ``chat``, over
    any API: a weather call (with its recorded id) and its result before each answer.
    Returns the chat's rows."""
    first, second = answers
    assert first.content.startswith("The current weather in Berlin is:")
    assert second.content.startswith("The current weather in Paris is:")
    rows = list(chat.messages.order_by("id"))
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"] * 2
    calls = [(c.call_id, c.name, c.arguments, c.state) for m in rows for c in m.tool_calls.all()]
    assert calls == [
        (call_ids[0], "weather", {"latitude": "52.5200", "longitude": "13.4050"}, "succeeded"),
        (call_ids[1], "weather", {"latitude": "48.8575", "longitude": "2.3514"}, "succeeded"),
    ]
    assert rows[2].content == "Current weather at 52.5200, 13.4050: 15°C, Wind: 10 km/h"
    return rows
