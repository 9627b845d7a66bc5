"""The public surface: ``agentloop.__all__``, and what importing the package pulls in."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentloop

REPO = Path(agentloop.__file__).resolve().parent.parent

#: the promised top-level names; a change here is an API change (add it on purpose).
EXPECTED_ALL = {
    "Agent",
    "AgentloopError",
    "Attachment",
    "BatchError",
    "BudgetExceededError",
    "CancelledError",
    "ChatBusyError",
    "ChatStoppedError",
    "ConcurrentWriteError",
    "ConfigurationError",
    "Conversation",
    "DecisionConflictError",
    "EditError",
    "Embeddings",
    "GuardrailBlockedError",
    "GuardrailError",
    "InvalidAnswerError",
    "InvalidArgumentsError",
    "LimitReachedError",
    "Message",
    "NeedsInput",
    "PendingToolCallsError",
    "ProviderError",
    "Tool",
    "ToolCall",
    "ToolError",
    "aembed",
    "batch",
    "chat",
    "embed",
    "tool",
}


#: what ``agentloop.models`` promises: the concrete models, their abstract mixins (custom
#: models, docs/custom-models.md), querysets and the choices their fields take.
EXPECTED_MODELS = {
    "EvalCase",
    "EvalCaseState",
    "EvalRun",
    "EvalSet",
    "MCPToken",
    "MCPTokenQuerySet",
    "AbstractBatch",
    "AbstractChat",
    "AbstractMemory",
    "AbstractMessage",
    "AbstractToolCall",
    "AbstractUsage",
    "Batch",
    "BatchItem",
    "BatchItemStatus",
    "BatchQuerySet",
    "BatchStatus",
    "Budget",
    "BudgetReservation",
    "BudgetSlot",
    "BulkResult",
    "Chat",
    "ChatQuerySet",
    "ChatState",
    "Memory",
    "MemoryQuerySet",
    "Message",
    "MessageEmbedding",
    "MessageEmbeddingQuerySet",
    "MessageQuerySet",
    "RateLimitBucket",
    "Role",
    "ToolCall",
    "ToolResultField",
    "Usage",
    "UsageQuerySet",
    "UsageStatus",
    "WorkingMemory",
}

#: what ``agentloop.admin`` promises: the model admins and actions a project's own admin reuses.
EXPECTED_ADMIN = {
    "EvalCaseAdmin",
    "EvalRunAdmin",
    "EvalSetAdmin",
    "MCPTokenAdmin",
    "make_eval_set",
    "ApprovalInbox",
    "BatchAdmin",
    "BudgetAdmin",
    "MemoryAdmin",
    "ChatAdmin",
    "MessageAdmin",
    "Timeline",
    "ToolCallAdmin",
    "UsageAdmin",
    "approve_pending",
    "build_timeline",
    "cancel_chats",
    "deny_pending",
    "halt_chats",
    "resume_chats",
    "switch_model",
}


#: what ``agentloop.data`` promises: export, erasure and retention (docs/data-retention.md).
EXPECTED_DATA = {
    "FORMAT",
    "VERSION",
    "Deleted",
    "ErasureReport",
    "RetentionReport",
    "delete_expired_memories",
    "delete_idle_chats",
    "expired_memories",
    "erase_owner",
    "export_owner",
    "idle_chats",
    "write_export",
}


#: what ``agentloop.streaming`` promises: the events of an iterated run and its two streams
#: (docs/streaming.md).
EXPECTED_STREAMING = {
    "AsyncEventStream",
    "EventStream",
    "EventTap",
    "FinalMessageEvent",
    "PartialOutputEvent",
    "StreamEvent",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallDeltaEvent",
    "ToolCallEvent",
    "ToolResultEvent",
}


#: what ``agentloop.memory`` promises: the memory tools, the recall part, whose memories a
#: chat reaches (docs/memory.md).
EXPECTED_MEMORY = {
    "MEMORY_TOOLS",
    "ChatMemories",
    "MemoryScope",
    "forget",
    "recall",
    "remember",
    "render_memories",
    "update_working_memory",
}


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("agentloop.streaming", EXPECTED_STREAMING),
        ("agentloop.models", EXPECTED_MODELS),
        ("agentloop.admin", EXPECTED_ADMIN),
        ("agentloop.data", EXPECTED_DATA),
        ("agentloop.memory", EXPECTED_MEMORY),
    ],
)
def test_the_models_and_admin_surfaces_are_the_expected_ones(module, expected):
    imported = importlib.import_module(module)
    assert set(imported.__all__) == expected
    assert len(imported.__all__) == len(expected)
    assert [name for name in expected if not hasattr(imported, name)] == []


def test_all_names_exist():
    missing = [name for name in agentloop.__all__ if not hasattr(agentloop, name)]
    assert missing == []


def test_all_is_the_expected_public_api():
    assert set(agentloop.__all__) == EXPECTED_ALL
    assert len(agentloop.__all__) == len(EXPECTED_ALL)  # no duplicates


def test_exceptions_are_the_same_objects_as_in_agentloop_exceptions():
    from agentloop import exceptions

    for name in agentloop.__all__:
        if name.endswith("Error"):
            assert getattr(agentloop, name) is getattr(exceptions, name)


def run_plain_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with no Django settings module."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.subprocess
def test_importing_agentloop_does_not_import_the_models():
    result = run_plain_python("""
        import sys
        import agentloop
        assert "agentloop.models" not in sys.modules, "agentloop.models was imported"
        assert "django.db" not in sys.modules, "django.db was imported"
    """)
    assert result.returncode == 0, result.stderr


@pytest.mark.subprocess
def test_the_engine_imports_no_django_module():
    result = run_plain_python("""
        import sys
        import agentloop.engine
        django = sorted(name for name in sys.modules if name.split(".")[0] == "django")
        assert django == [], django
    """)
    assert result.returncode == 0, result.stderr


@pytest.mark.subprocess
def test_tools_testing_and_providers_import_no_django_module():
    result = run_plain_python("""
        import sys
        import agentloop.tools, agentloop.testing, agentloop.providers, agentloop.messages
        django = sorted(name for name in sys.modules if name.split(".")[0] == "django")
        assert django == [], django
    """)
    assert result.returncode == 0, result.stderr


@pytest.mark.subprocess
def test_an_in_memory_chat_runs_in_a_plain_script_without_django_settings():
    result = run_plain_python("""
        import sys
        import agentloop
        from agentloop import providers
        from agentloop.testing import ScriptedProvider, tool_call

        @agentloop.tool
        def add(a: int, b: int) -> int:
            \"\"\"Adds.\"\"\"
            return a + b

        providers.register("scripted", ScriptedProvider(tool_call("add", {"a": 2, "b": 3}), "5"))
        answer = agentloop.chat("scripted:test", tools=[add]).ask("2+3?")
        assert answer.content == "5", answer
        # Settings are read through django.conf (unconfigured: the defaults); no database.
        assert "django.db" not in sys.modules
        assert "agentloop.models" not in sys.modules
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


ASYNC_VERBS = ("ask_later", "ask", "generate", "run_tools", "step", "complete", "cancel")


@pytest.mark.parametrize("owner", ["Conversation", "Chat"])
def test_every_verb_has_an_async_twin_with_the_same_parameters(owner):
    import inspect

    # Local: the models load once Django is set up.
    from agentloop.models import Chat

    verbs_of = Chat if owner == "Chat" else agentloop.Conversation
    for verb in (*ASYNC_VERBS, "is_complete"):
        sync, twin = getattr(verbs_of, verb), getattr(verbs_of, f"a{verb}")
        assert inspect.iscoroutinefunction(twin), f"{owner}.a{verb}"
        assert inspect.signature(twin).parameters.keys() == (
            inspect.signature(sync).parameters.keys()
        ), verb
        assert twin.__doc__, f"{owner}.a{verb} has no docstring"


def public_modules() -> list[str]:
    """The public modules docs/design.md lists (its "Public modules" list)."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text[text.index("### Public modules") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"^- `(agentloop[\w.]*)`(?:, `(agentloop[\w.]*)`)?", section, re.M)


def _listed() -> list[str]:
    return sorted({name for pair in public_modules() for name in pair if name})


@pytest.mark.parametrize("module", _listed())
def test_each_public_module_imports_with_every_name_it_promises(module):
    imported = importlib.import_module(module)
    assert not any(part.startswith("_") for part in module.split(".")), module
    promised = imported.__all__ if hasattr(imported, "__all__") else None
    if promised is None:  # a URLconf promises its URL patterns
        assert imported.urlpatterns, module
    else:
        assert promised, module
        assert [name for name in promised if not hasattr(imported, name)] == []


def _is_public(module: str, public: list[str]) -> bool:
    return not any(part.startswith("_") for part in module.split(".")) and any(
        module == listed or module.startswith(listed + ".") for listed in public
    )


def test_the_docs_import_only_public_modules():
    """Every page's ``from agentloop... import`` and ``include("agentloop...")`` names a module
    docs/design.md lists as public, or a public submodule of one."""
    public = _listed()
    pages = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    module = r"(agentloop(?:\.\w+)*)(?!\w)"
    pattern = re.compile(rf"(?:from|import) {module}|include\(\"{module}\"\)")
    offenders = [
        f"{page.name}: {name}"
        for page in pages
        for match in pattern.finditer(page.read_text())
        for name in match.groups()
        if name and not _is_public(name, public)
    ]
    assert offenders == []


def test_a_private_module_of_the_listed_packages_is_named_so():
    """In the packages cut into a public face and private modules (web, tools), every module
    that docs/design.md doesn't list starts with ``_``."""
    public = _listed()
    offenders = []
    for package in ("web", "tools"):
        for path in sorted((REPO / "agentloop" / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in public and not parts[-1].startswith("_"):
                offenders.append(name)
    assert offenders == []
