"""The offline demo: the rule-based model, its tools, and ``manage.py agentloop demo``."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import agentloop
from agentloop import ToolError, providers
from agentloop.engine._drivers import execute_tool
from agentloop.messages import (
    Message,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)
from agentloop.models import Chat, Usage
from agentloop.models import ToolCall as ToolCallRow
from example_project.demo import DEMO
from example_project.demo.provider import RuleBasedProvider, plan_tool_calls
from example_project.demo.tools import ListNotes, SaveNote, Weather, calculator, evaluate
from example_project.models import Note

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOOLS = [Weather, calculator, SaveNote, ListNotes]
DEMO_SETTINGS = {"DEFAULT_MODEL": "demo:rule-based", "DEMO": "example_project.demo.DEMO"}


def request_for(*messages: Message, tools=DEMO_TOOLS, **options) -> ModelRequest:
    return ModelRequest(
        model="rule-based",
        messages=list(messages),
        tools=[tool.definition() for tool in tools],
        **options,
    )


def user(text: str) -> Message:
    return Message(role="user", content=text)


def run_demo(*args: str) -> str:
    out = StringIO()
    call_command("agentloop", "demo", *args, stdout=out)
    return out.getvalue()


# -- the rule-based model ------------------------------------------------------------------
def test_the_example_project_registers_the_demo_provider_when_django_starts():
    assert isinstance(providers.get("demo"), RuleBasedProvider)


def test_plan_reads_arithmetic_and_every_city_in_order():
    plan = plan_tool_calls("What is (12 + 30) * 2, and what's the weather in Paris and New York?")

    assert plan == [
        ("calculator", {"expression": "(12 + 30) * 2"}),
        ("weather", {"city": "Paris"}),
        ("weather", {"city": "New York"}),
    ]


def test_plan_saves_everything_after_remember_as_the_note():
    plan = plan_tool_calls("Remember that the budget is 40-50 euros and notes are due Friday.")

    assert plan == [("save_note", {"text": "the budget is 40-50 euros and notes are due Friday"})]


def test_plan_lists_notes_when_asked_what_was_noted():
    assert plan_tool_calls("What did I note so far?") == [("list_notes", {})]
    assert plan_tool_calls("Show my notes") == [("list_notes", {})]


def test_plan_ignores_numbers_without_an_operator():
    assert plan_tool_calls("I have 3 cats and 2 dogs.") == []


def test_provider_calls_several_tools_in_one_answer():
    response = RuleBasedProvider().request(
        request_for(user("What's 2 + 2 and the weather in Rome?"))
    )

    assert [(call.name, call.arguments) for call in response.tool_calls] == [
        ("calculator", {"expression": "2 + 2"}),
        ("weather", {"city": "Rome"}),
    ]
    assert response.finish_reason == "tool_calls"
    assert len({call.id for call in response.tool_calls}) == 2


def test_provider_only_calls_tools_the_chat_offers():
    request = request_for(user("What's 2 + 2 and the weather in Rome?"), tools=[Weather])

    response = RuleBasedProvider().request(request)

    assert [call.name for call in response.tool_calls] == ["weather"]


def test_provider_makes_one_call_when_parallel_calls_are_off():
    request = request_for(user("2 + 2 and weather in Rome"), parallel_tool_calls=False)

    response = RuleBasedProvider().request(request)

    assert [call.name for call in response.tool_calls] == ["calculator"]


def test_provider_answers_without_tools_when_nothing_matches():
    response = RuleBasedProvider().request(request_for(user("Hello!")))

    assert response.tool_calls == []
    assert "offline demo model" in response.content


def test_provider_sums_up_the_tool_results_of_the_turn():
    call = ToolCall(id="demo_1", name="calculator", arguments={"expression": "6 * 7"})
    transcript = [
        user("What is 6 * 7?"),
        Message(role="assistant", content="Let me use calculator.", tool_calls=[call]),
        Message(role="tool", content="42", tool_call_id="demo_1", tool_name="calculator"),
    ]

    response = RuleBasedProvider().request(request_for(*transcript))

    assert response.content == "6 * 7 = 42."
    assert response.tool_calls == []
    assert response.finish_reason == "stop"


def test_provider_reports_error_results_as_problems():
    call = ToolCall(id="demo_1", name="calculator", arguments={"expression": "1 / 0"})
    transcript = [
        user("What is 1 / 0?"),
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", content="Division by zero.", tool_call_id="demo_1", is_error=True),
    ]

    response = RuleBasedProvider().request(request_for(*transcript))

    assert response.content == "The calculator tool reported a problem: Division by zero."


def test_provider_streams_text_word_by_word_then_the_tool_calls():
    chunks = []

    response = RuleBasedProvider().request(
        request_for(user("What is 1 + 1?"), stream=True), on_chunk=chunks.append
    )

    text = [chunk.text for chunk in chunks if isinstance(chunk, TextDelta)]
    assert text == ["Let ", "me ", "use ", "calculator."]
    assert "".join(text) == response.content
    deltas = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert deltas[0].name == "calculator"
    assert deltas[1].arguments == '{"expression": "1 + 1"}'


def test_provider_counts_words_as_tokens():
    request = request_for(user("What is 1 + 1?"), tools=[calculator])
    definition = calculator.definition()
    tool_words = len(f"{definition.name} {definition.description}".split()) + len(
        json.dumps(definition.parameters).split()
    )

    response = RuleBasedProvider().request(request)

    assert response.usage.input_tokens == 5 + tool_words  # "What is 1 + 1?" and the tool
    # "Let me use calculator." and the call: calculator {"expression": "1 + 1"}
    assert response.usage.output_tokens == 4 + 5


# -- the tools ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 ** 3 ** 2", 512),
        ("-2 ** 2", -4),
        ("-(3 - 5) * 2", 4),
        ("7 / 2", 3.5),
        ("10 - 4 - 3", 3),
        ("2 ** -1", 0.5),
    ],
)
def test_calculator_follows_python_precedence(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "(1).__class__",
        "x + 1",
        "abs(-1)",
        "[1, 2]",
        "True + 1",
        "'a' * 3",
        "1 if 1 else 2",
        "1 +",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression):
    with pytest.raises(ToolError):
        evaluate(expression)


def test_calculator_refuses_division_by_zero():
    with pytest.raises(ToolError, match="Division by zero"):
        evaluate("1 / (2 - 2)")


def test_calculator_refuses_powers_too_large_to_compute():
    with pytest.raises(ToolError, match="too large"):
        evaluate("9 ** 9 ** 9")


def test_calculator_tool_answers_integral_results_without_a_fraction():
    outcome = execute_tool(
        calculator, ToolCall(id="c1", name="calculator", arguments={"expression": "6 / 3"})
    )

    assert (outcome.content, outcome.is_error) == ("2", False)


def test_calculator_tool_turns_unsafe_input_into_an_error_result():
    arguments = {"expression": "__import__('os')"}

    outcome = execute_tool(calculator, ToolCall(id="c1", name="calculator", arguments=arguments))

    assert outcome.is_error
    assert "Unsupported" in outcome.content


def test_weather_is_the_same_for_a_city_every_time_and_says_it_is_made_up():
    first = Weather().execute(city="Paris")

    assert Weather().execute(city="paris ")["temperature_c"] == first["temperature_c"]
    assert "made-up demo data" in first["source"]


@pytest.mark.django_db
def test_notes_are_kept_per_chat_when_it_has_no_owner():
    first = Chat.objects.create(model="demo:rule-based").with_tools(SaveNote, ListNotes)
    second = Chat.objects.create(model="demo:rule-based").with_tools(SaveNote, ListNotes)

    first.ask("Remember that the door code is 1234.")
    answer = second.ask("What did I note?")

    assert list(Note.objects.values_list("chat", "text")) == [(first.pk, "the door code is 1234")]
    assert answer.content == "You have no notes yet."


@pytest.mark.django_db
def test_notes_follow_their_owner_from_chat_to_chat(user):
    first = Chat.objects.create(model="demo:rule-based", owner=user).with_tools(SaveNote)
    second = Chat.objects.create(model="demo:rule-based", owner=user).with_tools(ListNotes)

    first.ask("Note: water the plants")
    answer = second.ask("List my notes")

    assert Note.objects.get().owner == user
    assert answer.content == "Your notes: 1) water the plants."


def test_notes_need_a_persisted_chat():
    chat = agentloop.chat("demo:rule-based", tools=[SaveNote])

    answer = chat.ask("Remember that memory is short.")

    assert answer.content == (
        "The save_note tool reported a problem: "
        "Notes are kept in the database: they need a persisted chat."
    )


# -- manage.py agentloop demo --------------------------------------------------------------
@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_prints_the_tool_calls_and_the_answers_as_it_goes():
    output = run_demo()

    chat = Chat.objects.get()
    for line in [
        f"You: {DEMO['questions'][0]}",
        "Assistant: Let me use calculator and weather.",
        '  -> calculator(expression="(12 + 30) * 2 - 3 ** 2")',
        "  <- calculator: 75",
        '  -> weather(city="Tokyo")',
        "Assistant: (12 + 30) * 2 - 3 ** 2 = 75. In Paris it is",
        '  -> save_note(text="I pack an umbrella for Tokyo")',
        "  <- calculator error: Division by zero.",
        "Your notes: 1) I pack an umbrella for Tokyo.",
        "Usage: 6 model calls,",
        "python manage.py createsuperuser",
        f"/admin/agentloop/chat/{chat.pk}/change/",
    ]:
        assert line in output


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_stores_the_whole_conversation():
    run_demo()

    chat = Chat.objects.get()
    assert chat.model == "demo:rule-based"
    assert [m.role for m in chat.messages.all()] == (
        ["system"] + ["user", "assistant", "tool", "tool", "tool", "assistant"]
        + ["user", "assistant", "tool", "assistant"]
        + ["user", "assistant", "tool", "tool", "assistant"]
    )  # fmt: skip
    assert list(chat.tool_calls.values_list("name", "state")) == [
        ("calculator", "succeeded"),
        ("weather", "succeeded"),
        ("weather", "succeeded"),
        ("save_note", "succeeded"),
        ("calculator", "failed"),
        ("list_notes", "succeeded"),
    ]
    assert list(Note.objects.values_list("chat", "text")) == [
        (chat.pk, "I pack an umbrella for Tokyo")
    ]
    usage = Usage.objects.filter(chat=chat).totals()
    assert (usage["attempts"], usage["failed"]) == (6, 0)
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] > 0


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_options_replace_the_configured_questions_and_tools():
    output = run_demo("--tool", "example_project.demo.tools.calculator", "What is 6 * 7?")

    chat = Chat.objects.get()
    assert chat.tools == ["example_project.demo.tools.calculator"]
    assert "Assistant: 6 * 7 = 42." in output
    assert list(ToolCallRow.objects.values_list("name", flat=True)) == ["calculator"]


@pytest.mark.django_db
@override_settings(AGENTLOOP={})
def test_demo_without_questions_says_where_to_configure_them():
    with pytest.raises(CommandError, match=r"AGENTLOOP\['DEMO'\]"):
        run_demo()

    assert not Chat.objects.exists()


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_with_an_unknown_provider_fails_before_making_a_chat():
    with pytest.raises(CommandError, match="No provider is registered as 'nowhere'"):
        run_demo("--model", "nowhere:model")

    assert not Chat.objects.exists()


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_the_demo_chat_offers_delete_notes_which_asks_for_approval_first(user):
    run_demo("--owner", user.username)
    chat = Chat.objects.get()
    assert "example_project.demo.tools.DeleteNotes" in chat.tools

    answer = chat.ask("Delete my notes")

    assert answer.content == "Let me use delete_notes."
    assert chat.is_waiting()
    (waiting,) = chat.pending_approvals()
    assert waiting.name == "delete_notes"
    assert Note.objects.filter(owner=user).count() == 1  # nothing deleted before approval

    chat.approve(waiting.call_id, by=user)
    chat.complete()

    assert chat.messages.last().content == "Done: Deleted 1 note."
    assert not Note.objects.filter(owner=user).exists()


def test_the_demo_models_help_names_what_the_demo_chat_offers():
    offered = {path.rsplit(".", 1)[1] for path in DEMO["tools"]}
    provider = RuleBasedProvider()

    assert {"calculator", "Weather", "SaveNote", "ListNotes", "DeleteNotes"} <= offered
    assert "delete my notes" in provider.request(request_for(user("hi"))).content


def transcript_of_demo_site(out: StringIO) -> str:
    """What ``demo_site`` prints before it serves (its serving is not part of this)."""
    from example_project.management.commands import demo_site

    command = demo_site.Command(stdout=out)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo_site, "call_command", _without_runserver(demo_site.call_command))
        command.handle(port=free_port(), interactive=False, stdout=out)
    return out.getvalue()


def _without_runserver(call_command_):
    def calling(name, *args, **options):
        if name != "runserver":
            return call_command_(name, *args, **options)
        return None

    return calling


@pytest.mark.django_db(transaction=True)
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_make_demo_twice_keeps_the_database_says_so_and_shows_each_note_once():
    first = transcript_of_demo_site(StringIO())
    first_chat = Chat.objects.get()
    second = transcript_of_demo_site(StringIO())

    (second_chat,) = Chat.objects.all()  # the first run's demo chat was replaced
    assert second_chat.pk != first_chat.pk
    assert "is kept between runs (delete it to start from nothing)." in first
    replaced = f"; this run replaces the demo chat #{first_chat.pk}."
    assert f"is kept between runs (delete it to start from nothing){replaced}" in second
    for output in (first, second):
        assert output.count("Your notes: 1) I pack an umbrella for Tokyo.") == 1
        assert "2) I pack an umbrella" not in output
    assert list(Note.objects.values_list("text", flat=True)) == ["I pack an umbrella for Tokyo"]


def example_site_env(tmp_path) -> dict[str, str]:
    """What `make demo` runs with: the example project's own settings, on a new SQLite file."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    for key in ("AGENTLOOP_TEST_DB_NAME", "AGENTLOOP_MODEL"):
        env.pop(key, None)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_listening(port: int, server: subprocess.Popen, deadline: float = 60) -> None:
    """Until the server accepts connections (it prints its URL before it binds)."""
    end = time.monotonic() + deadline
    while True:
        assert server.poll() is None, "the demo site exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < end, f"nothing listens on port {port}"
            time.sleep(0.1)


def read_until(server: subprocess.Popen, prefix: str) -> list[str]:
    """Lines of the server's output up to and including the first that starts with ``prefix``."""
    lines: list[str] = []
    assert server.stdout is not None
    for line in server.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return lines
    raise AssertionError(
        "the demo site ended before printing " + repr(prefix) + ":\n" + "\n".join(lines)
    )


def log_in(client: httpx.Client, username: str, password: str) -> None:
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text


@pytest.mark.subprocess
@pytest.mark.timeout(180)
def test_make_demo_serves_a_chat_the_demo_user_owns_and_its_admin_pages(tmp_path):
    """What `make demo` runs, from a fresh database: every printed link opens for demo/demo."""
    port = free_port()
    errors = (tmp_path / "stderr.log").open("w")
    server = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
        [sys.executable, str(ROOT / "manage.py"), "demo_site", "--port", str(port)],
        env=example_site_env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE, stderr=errors,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output = read_until(server, "The demo chat: ")
        wait_until_listening(port, server)
        site = f"http://127.0.0.1:{port}"
        chat_link = output[-1].removeprefix("The demo chat: ")
        (admin_line,) = [line for line in output if line.startswith("See it in the admin: ")]
        admin_link = admin_line.removeprefix("See it in the admin: ")
        assert f"The example site: {site}/  (log in as demo / demo)" in output
        assert '  -> weather(city="Paris")' in output

        with httpx.Client(base_url=site, timeout=30) as client:
            log_in(client, "demo", "demo")
            chat_page = client.get(chat_link.removeprefix(site))
            admin_page = client.get(admin_link.removeprefix(site))
            admin_list = client.get("/admin/agentloop/chat/")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        server.stdout.close()  # type: ignore[union-attr]
        errors.close()

    assert chat_link.startswith(f"{site}/chats/")
    assert admin_link.startswith(f"{site}/admin/agentloop/chat/")
    assert chat_page.status_code == 200
    assert "I pack an umbrella for Tokyo" in chat_page.text
    assert admin_page.status_code == 200  # not a redirect to the admin's login
    assert "agentloop demo" in admin_page.text
    assert admin_list.status_code == 200


@pytest.mark.subprocess
def test_demo_site_on_a_busy_port_says_so_in_one_line_before_anything_else(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(  # noqa: S603 - our own interpreter and manage.py
            [sys.executable, str(ROOT / "manage.py"), "demo_site", "--port", str(port)],
            env=example_site_env(tmp_path), cwd=ROOT, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"CommandError: Port {port} is in use: stop what serves on it, or pick another port "
        f"(make demo PORT={port + 1})."
    ]
    assert result.stdout == ""  # no URL printed, no demo run
    assert tables_of(tmp_path / "demo.sqlite3") == []  # not even migrated


def tables_of(database: Path) -> list[str]:
    """The tables of a SQLite file (none when the file was never made)."""
    if not database.exists():
        return []
    with closing(sqlite3.connect(database)) as connection:
        return [row[0] for row in connection.execute("SELECT name FROM sqlite_master")]


def test_make_demo_passes_port_to_the_site():
    dry_run = subprocess.run(
        ["make", "-n", "demo", "PORT=8001"], cwd=ROOT, capture_output=True, text=True, check=True
    )

    assert "manage.py demo_site --port 8001" in dry_run.stdout


@pytest.mark.django_db
def test_the_demo_user_is_staff_with_the_permissions_of_the_demo_apps():
    from django.contrib.auth import get_user_model

    from example_project.management.commands.demo_site import ensure_demo_user

    get_user_model().objects.create_user(username="demo", password="demo")  # an older demo

    assert ensure_demo_user() is False
    user = get_user_model().objects.get(username="demo")
    assert user.is_staff
    assert not user.is_superuser
    for permission in ("view_chat", "change_chat", "view_message", "view_note"):
        app = "example_project" if permission == "view_note" else "agentloop"
        assert user.has_perm(f"{app}.{permission}")
    assert not user.has_perm("auth.change_user")


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_owner_owns_the_chat_and_site_links_the_admin_there(user):
    output = run_demo("--owner", user.username, "--site", "http://127.0.0.1:8001")

    chat = Chat.objects.get()
    assert chat.owner == user
    assert f"See it in the admin: http://127.0.0.1:8001/admin/agentloop/chat/{chat.pk}/change/" in (
        output
    )
    assert "createsuperuser" not in output


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_hints_name_the_interpreter_that_ran_it():
    """Not a bare ``python``: in a fresh clone that is not the .venv's (issue 12)."""
    output = run_demo()

    (hint,) = [line for line in output.splitlines() if "manage.py createsuperuser" in line]
    interpreter = hint.split()[0]
    assert Path(interpreter).resolve() == Path(sys.executable).resolve()


@pytest.mark.django_db
@override_settings(AGENTLOOP=DEMO_SETTINGS)
def test_demo_with_an_unknown_owner_fails_before_making_a_chat():
    with pytest.raises(CommandError, match="No user 'nobody'"):
        run_demo("--owner", "nobody")

    assert not Chat.objects.exists()
