"""agentloop.E010: a configured Vertex AI provider with no project or no location it can find
fails the system check; one that finds both (settings, environment, credentials) passes."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agentloop import providers
from agentloop.checks import check_vertex_ai
from tests.providers.vertex_wire import user_file


@pytest.fixture(autouse=True)
def _no_google_environment(monkeypatch):
    for variable in (
        "GOOGLE_CLOUD_PROJECT",
        "GCLOUD_PROJECT",
        "GOOGLE_CLOUD_LOCATION",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.delenv(variable, raising=False)
    yield
    providers.forget_configured()


def messages(agentloop):
    providers.forget_configured()
    with override_settings(AGENTLOOP=agentloop):
        return [(m.id, m.obj, m.msg) for m in check_vertex_ai()]


def test_e010_no_location_and_no_project_fail():
    found = messages({"PROVIDERS": {"vertexai": {}}})

    assert [(i, obj) for i, obj, _ in found] == [("agentloop.E010", "vertexai")] * 2
    assert "No Vertex AI location" in found[0][2] and "GOOGLE_CLOUD_LOCATION" in found[0][2]
    assert "No Google Cloud project" in found[1][2]


def test_e010_a_default_model_on_vertex_is_checked():
    found = messages({"DEFAULT_MODEL": "vertexai:gemini-2.5-flash"})

    assert {obj for _, obj, _ in found} == {"vertexai"} and len(found) == 2


def test_e010_credentials_that_name_no_project_fail(tmp_path):
    setting = {"location": "global", "credentials": user_file(tmp_path)}

    (found,) = messages({"PROVIDERS": {"vertexai": setting}})

    assert found[0] == "agentloop.E010"
    assert "No Google Cloud project" in found[2]


def test_e010_adc_that_names_no_project_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", user_file(tmp_path))

    (found,) = messages({"PROVIDERS": {"vertexai": {"location": "us-central1"}}})

    assert "No Google Cloud project" in found[2]


def test_e010_unreadable_credentials_fail(tmp_path):
    path = tmp_path / "nothing.json"
    path.write_text("[]")
    setting = {"location": "global", "credentials": str(path)}

    (found,) = messages({"PROVIDERS": {"vertexai": setting}})

    assert "No usable Google credentials" in found[2]


@pytest.mark.parametrize(
    "setting",
    [
        {"project": "p", "location": "global"},
        {"project": "p", "location": "europe-west4", "endpoint_url": "https://gw.internal"},
    ],
)
def test_e010_a_project_and_location_in_the_settings_pass(setting):
    assert messages({"PROVIDERS": {"vertexai": setting}}) == []


def test_e010_the_environment_passes(monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "global")

    assert messages({"DEFAULT_MODEL": "vertexai:gemini-2.5-flash"}) == []


def test_e010_the_project_of_the_credentials_passes(tmp_path):
    setting = {"location": "global", "credentials": user_file(tmp_path, quota_project_id="q")}

    assert messages({"PROVIDERS": {"vertexai": setting}}) == []


def test_e010_a_second_vertex_provider_under_its_own_name_is_checked(tmp_path):
    second = {
        "class": "agentloop.providers.vertex.VertexAIProvider",
        "location": "global",
        "credentials": user_file(tmp_path),
    }

    found = messages({"PROVIDERS": {"vertex-eu": second, "gemini": {"api_key": "k"}}})

    assert [obj for _, obj, _ in found] == ["vertex-eu"]


def test_e010_other_providers_are_not_checked():
    assert messages({"DEFAULT_MODEL": "gemini:gemini-2.5-flash", "PROVIDERS": {"openai": {}}}) == []
