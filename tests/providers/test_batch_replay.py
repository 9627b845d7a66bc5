"""Batches replayed over the recorded batch traffic (``batch_with_*`` cassettes; test ids are
the cassette names): OpenAI (Batch API over Responses), Anthropic (Message Batches) and Gemini
(batch mode).

For each, persisted chats holding the recorded prompts go through ``agentloop.batch`` and
polling against ``Cassette.transport()``, which serves the recorded answers in order:

* the requests: we make the recorded calls, in the recorded order (method and URL each), and
  the batch we submit equals the recorded one, item by item (custom ids included);
* the results: each chat gets the recorded answer, with a usage row of the recorded tokens
  priced at half the catalog price.

Deliberate differences, each normalised away in :func:`comparable` below:

* names we choose: the uploaded file's name (OpenAI, ``agentloop_batch.jsonl``) and the
  batch's ``displayName`` (Gemini, ``agentloop-batch-<pk>``);
* Gemini: we leave out an empty ``generationConfig`` (``{}`` asks for nothing).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest

import agentloop
from agentloop import providers
from agentloop.batches import cancel as cancel_batch
from agentloop.batches import refresh as refresh_batch
from agentloop.evals.batch_rounds import refresh as refresh_eval_batch
from agentloop.evals.running import start_run
from agentloop.evals.sets import set_from_jsonl
from agentloop.messages import ModelRequest, TokenUsage
from agentloop.models import Batch, BatchStatus, Chat
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.batch_apis import batch_api
from agentloop.providers.catalog import price_of
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.cassettes import Cassette, names, pass_counts, require_fixtures

pytestmark = pytest.mark.django_db

# every test here replays the recordings: skipped without them (failing under CI=true)
require_fixtures()
CASSETTES = names("batch_with_")
ANSWERS = [
    name
    for name in CASSETTES
    if name.endswith("_answers_staged_chats_and_appends_the_answers_to_their_conversations")
]

#: cassette vendor -> (provider name, class, model id)
VENDORS = {
    "openai": ("openai-responses", OpenAIResponsesProvider, "gpt-5-nano"),
    "anthropic": ("anthropic", AnthropicProvider, "claude-haiku-4-5"),
    "gemini": ("gemini", GeminiProvider, "gemini-2.5-flash"),
}


def vendor_of(name: str) -> str:
    return name.removeprefix("batch_with_").split("_", 1)[0]


@pytest.fixture
def replay(request: pytest.FixtureRequest, replaying):
    """The cassette of the test's id, its vendor's provider registered over it."""
    name = request.node.callspec.params["name"]
    provider_name, provider_class, model = VENDORS[vendor_of(name)]
    cassette = replaying(name, provider_class, register_as=provider_name)
    return cassette, f"{provider_name}:{model}"


# "batches: N of M cassettes pass" (a cassette passes when every test of it passed)
_pass_counts = pass_counts(__name__, "Batch replay", "batches")


def test_the_batch_cassettes_are_there():
    assert {vendor_of(name) for name in ANSWERS} == set(VENDORS)
    assert len(CASSETTES) == 5, CASSETTES


# -- reading the recorded submissions ----------------------------------------------------------
def jsonl_of_upload(body: str | bytes) -> list[dict[str, Any]]:
    """The JSONL lines of a multipart upload (ours is bytes, the recorded one text)."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def recorded_prompts(cassette: Cassette) -> list[tuple[str | None, str]]:
    """(system text, user text) of each recorded batch request, in order."""
    first = cassette.interactions[0]
    vendor = vendor_of(cassette.name)
    prompts = []
    if vendor == "openai":
        for line in jsonl_of_upload(first.request_body):
            (message,) = line["body"]["input"]
            prompts.append((line["body"].get("instructions"), message["content"]))
    elif vendor == "anthropic":
        for item in first.request_body["requests"]:
            params = item["params"]
            system = "".join(block["text"] for block in params.get("system", [])) or None
            (message,) = params["messages"]
            prompts.append((system, message["content"][0]["text"]))
    else:
        for item in first.request_body["batch"]["inputConfig"]["requests"]["requests"]:
            request = item["request"]
            parts = (request.get("systemInstruction") or {}).get("parts") or []
            system = "".join(part["text"] for part in parts) or None
            (content,) = request["contents"]
            prompts.append((system, content["parts"][0]["text"]))
    return prompts


def staged_chats(cassette: Cassette, model: str) -> list[Chat]:
    """Persisted chats holding the recorded prompts, awaiting the model."""
    chats = []
    for system, text in recorded_prompts(cassette):
        chat = Chat.objects.create(model=model)
        if system:
            chat.with_instructions(system)
        chats.append(chat.ask_later(text))
    return chats


def comparable(vendor: str, body: Any) -> Any:
    """A submission without the names each client picks (see the module docstring)."""
    if vendor == "openai":
        return jsonl_of_upload(body)
    body = json.loads(body) if isinstance(body, bytes) else body
    if vendor == "gemini":
        batch = body["batch"]
        batch.pop("displayName")
        for item in batch["inputConfig"]["requests"]["requests"]:
            if item["request"].get("generationConfig") == {}:
                del item["request"]["generationConfig"]
    return body


def calls(requests: list[Any]) -> list[tuple[str, str]]:
    return [(request.method, str(request.url)) for request in requests]


def poll_to_the_end(batch: Batch, cassette: Cassette) -> Batch:
    """Poll as the periodic task does, until the results are in (one status read a poll)."""
    while batch.collected_at is None:
        assert len(cassette.sent) < len(cassette.interactions), "polled past the recording"
        refresh_batch(batch)
        batch.refresh_from_db()
    return batch


# -- the whole round: submit, poll, collect ----------------------------------------------------
@pytest.mark.parametrize("name", ANSWERS, ids=ANSWERS)
def test_batched_chats_send_the_recorded_batch(name, replay):
    cassette, model = replay
    vendor = vendor_of(name)

    agentloop.batch(staged_chats(cassette, model))

    ours = cassette.sent[0].content
    assert comparable(vendor, ours) == comparable(vendor, cassette.interactions[0].request_body)
    if vendor == "openai":  # then the batch itself, over the uploaded file
        assert json.loads(cassette.sent[1].content) == cassette.interactions[1].request_body


@pytest.mark.parametrize("name", ANSWERS, ids=ANSWERS)
def test_polling_makes_the_recorded_calls_in_order(name, replay):
    cassette, model = replay

    poll_to_the_end(agentloop.batch(staged_chats(cassette, model)), cassette)

    recorded = [(i.method, i.uri) for i in cassette.interactions]
    assert calls(cassette.sent) == recorded


def recorded_answers(cassette: Cassette) -> list[tuple[str, dict[str, int]]]:
    """(text, usage) of each recorded result, by custom id order."""
    vendor = vendor_of(cassette.name)
    last = cassette.interactions[-1]
    found: dict[str, tuple[str, dict[str, int]]] = {}
    if vendor == "openai":
        for line in map(json.loads, last.response_text.splitlines()):
            body = line["response"]["body"]
            text = "".join(
                part["text"]
                for item in body["output"]
                if item["type"] == "message"
                for part in item["content"]
            )
            usage = body["usage"]
            found[line["custom_id"]] = (
                text,
                {
                    "input": usage["input_tokens"],
                    "output": usage["output_tokens"],
                    "reasoning": usage["output_tokens_details"]["reasoning_tokens"],
                },
            )
    elif vendor == "anthropic":
        for line in map(json.loads, last.response_text.splitlines()):
            message = line["result"]["message"]
            usage = message["usage"]
            found[line["custom_id"]] = (
                "".join(block["text"] for block in message["content"]),
                {"input": usage["input_tokens"], "output": usage["output_tokens"], "reasoning": 0},
            )
    else:
        output = last.response_json()["response"]["inlinedResponses"]["inlinedResponses"]
        for item in output:
            response = item["response"]
            usage = response["usageMetadata"]
            found[item["metadata"]["custom_id"]] = (
                "".join(p["text"] for p in response["candidates"][0]["content"]["parts"]),
                # Gemini's thinking tokens are output tokens too (billed as output).
                {
                    "input": usage["promptTokenCount"],
                    "output": usage["candidatesTokenCount"] + usage["thoughtsTokenCount"],
                    "reasoning": usage["thoughtsTokenCount"],
                },
            )
    return [found[key] for key in sorted(found)]


@pytest.mark.parametrize("name", ANSWERS, ids=ANSWERS)
def test_recorded_results_become_each_chats_answer_and_usage(name, replay):
    cassette, model = replay
    chats = staged_chats(cassette, model)

    batch = poll_to_the_end(agentloop.batch(chats), cassette)

    assert batch.status == BatchStatus.ENDED
    assert (batch.request_count, batch.succeeded_count, batch.failed_count) == (2, 2, 0)
    model_id = model.partition(":")[2]
    for chat, (text, usage) in zip(chats, recorded_answers(cassette), strict=True):
        answer = chat.messages.order_by("id").last()
        assert (answer.role, answer.content, answer.status) == ("assistant", text, "complete")
        (row,) = chat.usage_records.all()
        assert (row.provider, row.model, row.status) == (
            model.partition(":")[0],
            model_id,
            "succeeded",
        )
        assert (row.input_tokens, row.output_tokens, row.reasoning_tokens) == (
            usage["input"],
            usage["output"],
            usage["reasoning"],
        )
        assert row.message == answer
        tokens = TokenUsage(input_tokens=row.input_tokens, output_tokens=row.output_tokens)
        full = price_of(model_id, tokens)
        assert full is not None  # the catalog prices these models
        assert row.cost == (full / 2).quantize(Decimal("0.00000001"))


# -- a batch-mode eval run over the same traffic (docs/evals.md) -------------------------------
@pytest.mark.parametrize("name", ANSWERS, ids=ANSWERS)
def test_a_batched_eval_run_sends_the_recorded_batch_and_scores_the_recorded_answers(name, replay):
    cassette, model = replay
    vendor = vendor_of(name)
    answers = recorded_answers(cassette)
    lines = []
    for (system, text), (answer, _) in zip(recorded_prompts(cassette), answers, strict=True):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        lines.append(json.dumps({"messages": messages, "expected": answer}))

    run = start_run(set_from_jsonl(vendor, lines), model, batch=True)

    ours = cassette.sent[0].content
    assert comparable(vendor, ours) == comparable(vendor, cassette.interactions[0].request_body)
    (batch,) = run.batches.all()
    while batch.collected_at is None:
        assert len(cassette.sent) < len(cassette.interactions), "polled past the recording"
        refresh_eval_batch(batch)
        batch.refresh_from_db()
    assert calls(cassette.sent) == [(i.method, i.uri) for i in cassette.interactions]
    model_id = model.partition(":")[2]
    cases = list(run.cases.order_by("position"))
    for case, (text, usage) in zip(cases, answers, strict=True):
        assert (case.state, case.answer) == ("passed", text)  # scored: exact, as expected
        assert (case.input_tokens, case.output_tokens) == (usage["input"], usage["output"])
        tokens = TokenUsage(input_tokens=usage["input"], output_tokens=usage["output"])
        full = price_of(model_id, tokens)
        assert full is not None
        assert case.cost == (full / 2).quantize(Decimal("0.00000001"))  # the batch price
    assert not Chat.objects.exists()  # replayed apart from owners' chats


# -- Anthropic: cancel, and reading a batch by id -----------------------------------------------
CANCEL = "batch_with_anthropic_claude-haiku-4-5_cancels_a_running_batch"
RELOAD = (
    "batch_with_anthropic_claude-haiku-4-5_reloads_a_batch_by_id_and_collects_messages_"
    "without_the_chats"
)


@pytest.mark.parametrize("name", [CANCEL], ids=[CANCEL])
def test_cancelling_a_batch_sends_the_recorded_cancel(name, replay):
    cassette, model = replay
    (chat,) = staged_chats(cassette, model)
    batch = agentloop.batch([chat])

    cancel_batch(batch)

    assert calls(cassette.sent) == [(i.method, i.uri) for i in cassette.interactions]
    assert cassette.sent_bodies() == [i.request_body for i in cassette.interactions]
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLING
    assert batch.provider_batch_id == "msgbatch_016z7nD8oj5sT4pMEcEnvJQQ"
    assert batch.collected_at is None  # what was answered before the cancel is still collected


@pytest.mark.parametrize("name", [RELOAD], ids=[RELOAD])
def test_a_batch_read_by_id_gives_its_answers_without_the_chats(name, replay):
    cassette, model = replay
    ((system, text),) = recorded_prompts(cassette)
    api = batch_api(providers.get("anthropic"))
    request = ModelRequest(
        model="claude-haiku-4-5", messages=[agentloop.Message(role="user", content=text)]
    )

    submitted = api.submit([("0", request)])
    while not api.status(submitted.id).finished:
        pass
    reloaded = api.status(submitted.id)  # another process, knowing only the id
    results = api.results(reloaded.id)

    assert system is None
    assert cassette.sent_bodies()[0] == cassette.interactions[0].request_body
    assert calls(cassette.sent) == [(i.method, i.uri) for i in cassette.interactions]
    assert (reloaded.status, reloaded.succeeded_count) == ("ended", 1)
    assert results["0"].content == "6"
    assert (results["0"].usage.input_tokens, results["0"].usage.output_tokens) == (20, 5)


def test_every_batch_cassette_is_replayed():
    covered = set(ANSWERS) | {CANCEL, RELOAD}
    assert covered == set(CASSETTES)
    assert all(re.match(r"batch_with_(openai|anthropic|gemini)_", name) for name in CASSETTES)
