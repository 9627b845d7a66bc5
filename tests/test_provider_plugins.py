"""Providers as plugins: an installed package's entry point in the ``agentloop.providers``
group gives every process a provider, with no code in the project (docs/providers/index.md,
"A provider in a package of its own").

The in-process tests install packages as pip leaves them (a ``.dist-info`` folder with
``entry_points.txt`` on ``sys.path``); the last one builds the page's example package with pip
from its folder, installs it into a new virtualenv and answers a chat in a new process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

import agentloop
from agentloop import ConfigurationError, providers
from agentloop.exceptions import UnknownProviderError
from agentloop.providers.openai import OpenAIProvider
from tests.doc_blocks import ROOT, blocks_of

PAGE = ROOT / "docs" / "providers" / "index.md"
_PACKAGE_FILE = re.compile(r"^# agentloop-shout/(?P<path>\S+)$")
IN_CI = os.environ.get("CI") == "true"


def page_package() -> dict[str, str]:
    """The example package's files as the page shows them: path -> text."""
    files = {}
    for block in blocks_of(PAGE.read_text()):
        first, _, rest = block.code.partition("\n")
        match = _PACKAGE_FILE.match(first)
        if match:
            files[match["path"]] = rest
    return files


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on ``sys.path`` to install packages into as pip would (dist-info + modules)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    providers.forget_configured()
    for name in [n for n in sys.modules if n.startswith("plugin_")]:
        del sys.modules[name]


def install(site: Path, package: str, entry_points: dict[str, str], code: str = "") -> None:
    """A package ``package`` offering ``entry_points`` (name -> "module:attr"), with a module
    ``plugin_<package>`` holding ``code``."""
    module = "plugin_" + package.replace("-", "_")
    (site / f"{module}.py").write_text(code)
    info = site / f"{package.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[agentloop.providers]\n" + "\n".join(lines) + "\n")


SHOUT = """
from agentloop.messages import ModelResponse
from agentloop.providers import Provider


class Shout(Provider):
    def __init__(self, name="shout"):
        self.name = name

    def request(self, request, *, on_chunk=None):
        return ModelResponse(content=request.messages[-1].content.upper(), finish_reason="stop")
"""


def test_an_installed_package_offers_its_provider_by_name(site):
    install(site, "agentloop-shout", {"shout": "plugin_agentloop_shout:Shout"}, SHOUT)

    provider = providers.get("shout")

    assert type(provider).__name__ == "Shout"
    assert provider.name == "shout"
    assert agentloop.chat("shout:any").ask("hello").content == "HELLO"
    assert "shout" in providers.available()


def test_a_built_in_name_stays_the_built_in(site):
    install(site, "agentloop-fake-openai", {"openai": "plugin_agentloop_fake_openai:Shout"}, SHOUT)

    assert isinstance(providers.get("openai"), OpenAIProvider)


def test_a_class_named_in_settings_wins_over_a_package(site, settings):
    install(site, "agentloop-shout", {"shout": "plugin_agentloop_shout:Shout"}, SHOUT)
    settings.AGENTLOOP = {
        "PROVIDERS": {"shout": {"class": "agentloop.testing.OfflineProvider", "reply": "Hm."}}
    }

    assert agentloop.chat("shout:any").ask("hello").content == "Hm."


def test_two_packages_offering_one_name_are_refused_naming_both(site):
    install(site, "pkg-one", {"shout": "plugin_pkg_one:Shout"}, SHOUT)
    install(site, "pkg-two", {"shout": "plugin_pkg_two:Shout"}, SHOUT)

    with pytest.raises(ConfigurationError) as raised:
        providers.get("shout")

    assert str(raised.value) == (
        "Installed packages pkg-one, pkg-two all offer provider 'shout' (entry point group "
        "'agentloop.providers'): uninstall all but one, or name the class in "
        "AGENTLOOP['PROVIDERS']['shout']['class']"
    )


def test_a_package_that_fails_to_load_is_named_in_one_line(site):
    install(
        site, "agentloop-broken", {"broken": "plugin_agentloop_broken:Gone"}, "import nowhere\n"
    )

    with pytest.raises(ConfigurationError) as raised:
        providers.get("broken")

    assert str(raised.value) == (
        "Provider 'broken' of the installed package agentloop-broken "
        "(plugin_agentloop_broken:Gone) can't be loaded: "
        "ModuleNotFoundError: No module named 'nowhere'"
    )


def test_a_package_whose_entry_point_is_no_provider_is_refused(site):
    code = "class NotAProvider:\n    def __init__(self, name):\n        self.name = name\n"
    install(site, "agentloop-odd", {"odd": "plugin_agentloop_odd:NotAProvider"}, code)

    with pytest.raises(ConfigurationError) as raised:
        providers.get("odd")

    assert str(raised.value) == (
        "The class of the package agentloop-odd (provider 'odd') is not an agentloop Provider"
    )


def test_a_name_no_package_offers_is_still_unknown(site):
    install(site, "agentloop-shout", {"shout": "plugin_agentloop_shout:Shout"}, SHOUT)

    with pytest.raises(UnknownProviderError, match=r"registered or configured there: .*shout"):
        providers.get("nobody-offers-this")


# -- the page's package, built and installed with pip -------------------------------------------
@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_the_pages_package_installed_with_pip_answers_in_a_new_process(tmp_path):
    files = page_package()
    assert sorted(files) == ["agentloop_shout.py", "pyproject.toml"]
    package = tmp_path / "agentloop-shout"
    package.mkdir()
    for path, text in files.items():
        (package / path).write_text(text)
    started = time.monotonic()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)  # noqa: S603
    python = venv / "bin" / "python"
    # This environment's packages (Django, agentloop and setuptools) seen from the new one.
    purelib = subprocess.run(  # noqa: S603 - the new virtualenv's interpreter
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    outer = {str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "outer.pth").write_text("\n".join(sorted(outer)) + "\n")
    # pip, offline: the package's own folder, built with this environment's setuptools.
    pip = subprocess.run(  # noqa: S603 - our own interpreter's pip
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", package],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    if pip.returncode != 0 and "bdist_wheel" in pip.stdout + pip.stderr and not IN_CI:
        pytest.skip("this environment's setuptools is older than 70.1: make venv updates it")
    assert pip.returncode == 0, pip.stdout + pip.stderr

    script = (
        "from django.conf import settings\n"
        "settings.configure()\n"
        "import agentloop\n"
        "from agentloop import providers\n"
        "print(type(providers.get('shout')).__module__, providers.available())\n"
        "print(agentloop.chat('shout:any').ask('hello from a plugin').content)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    result = subprocess.run(  # noqa: S603 - the new virtualenv's interpreter
        [python, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "agentloop_shout ['shout']",
        "HELLO FROM A PLUGIN",
    ]
    installed = list(Path(purelib).glob("agentloop_shout-0.1.0.dist-info"))
    assert installed, "pip installed the package into the new virtualenv"
    assert elapsed < 60, f"{elapsed:.1f} s"
