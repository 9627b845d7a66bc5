"""Where an HTTP provider's requests go: its endpoint (``endpoint_url``, or the older name
``base_url``) and the proxy they pass through (``proxy``), checked when used, with a
proxy's password kept out of every repr and configuration error (an error from a call is
redacted by :mod:`.redaction`).

Both names of the endpoint are read for every provider family. Given both at one level
(the constructor, or one provider's settings) they must agree: two different addresses
for one provider is a mistake (two settings files merged, a half-done rename), and
guessing would send the API key to a host nobody chose, so it is refused.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from ..exceptions import ConfigurationError

__all__ = ["configured_url", "masked", "proxy_url", "shown_address"]

_ENDPOINT_SCHEMES = ("http", "https")
# SOCKS needs httpx's "socks" extra (socksio).
_PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")
# Everything between a URL's scheme (or its start) and the last "@": a user and password.
_USERINFO = re.compile(r"^((?:[a-zA-Z][a-zA-Z0-9+.-]*://)?)[^/?#]*@")


def masked(url: str) -> str:
    """``url`` with its password shown as ``***`` (a user alone, which may be a token, is
    hidden whole); safe for reprs and error messages."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        user = password = None
    if user is None or password is None:
        return _USERINFO.sub(r"\1***@", url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def _checked(value: object, where: str, schemes: tuple[str, ...], example: str) -> str:
    """``value`` when it is a URL of one of ``schemes`` with a host; else a one-line error."""
    # Every model call reads its provider's endpoint: a URL that passed is not parsed again.
    if isinstance(value, str) and (value, schemes) in _PASSED:
        return value
    if not isinstance(value, str) or any(c.isspace() for c in value):
        raise _not_a_url(value, where, schemes, example)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise _not_a_url(value, where, schemes, example) from None
    if parts.scheme.lower() not in schemes or not parts.hostname:
        raise _not_a_url(value, where, schemes, example)
    if len(_PASSED) >= _PASSED_KEPT:  # settings that change at run time (tests) stay bounded
        _PASSED.clear()
    _PASSED.add((value, schemes))
    return value


#: the (URL, schemes) pairs :func:`_checked` passed, at most ``_PASSED_KEPT``.
_PASSED: set[tuple[str, tuple[str, ...]]] = set()
_PASSED_KEPT = 256


def _not_a_url(
    value: object, where: str, schemes: tuple[str, ...], example: str
) -> ConfigurationError:
    kind = type(value).__name__
    shown = repr(masked(value)) if isinstance(value, str) else f"a value of type {kind}"
    return ConfigurationError(
        f"{where} must be a URL ({', '.join(s + '://' for s in schemes)}) naming a host, "
        f"such as {example!r}, not {shown}"
    )


def configured_url(
    provider: str,
    given: tuple[str | None, str | None],
    settings: tuple[object, object],
) -> str | None:
    """The endpoint configured for ``provider``: ``(endpoint_url, base_url)`` given to the
    constructor, else the pair in its settings; None when neither level sets one.

    Within a level the two names must agree (trailing slashes aside): ConfigurationError
    otherwise. Across levels the constructor wins, as for every other option.
    """
    setting = f"AGENTLOOP['PROVIDERS'][{provider!r}]"
    levels = (
        (given, f"The {provider!r} provider was given", "endpoint_url={!r}", "base_url={!r}"),
        (settings, setting + " sets", "'endpoint_url' {!r}", "'base_url' {!r}"),
    )
    for index, ((endpoint, base), where, endpoint_named, base_named) in enumerate(levels):
        if endpoint and base and str(endpoint).rstrip("/") != str(base).rstrip("/"):
            raise ConfigurationError(
                f"{where} both {endpoint_named.format(masked(str(endpoint)))} and "
                f"{base_named.format(masked(str(base)))}: base_url is the older name of "
                "endpoint_url, so keep one"
            )
        url = endpoint or base
        if url:
            key = "endpoint_url" if endpoint else "base_url"
            named = f"The {provider!r} provider's {key}=" if index == 0 else f"{setting}[{key!r}]"
            return _checked(url, named, _ENDPOINT_SCHEMES, "https://llm.internal/v1")
    return None


def proxy_url(provider: str, value: object) -> str | None:
    """``value`` checked as a proxy URL (None: no proxy)."""
    if value is None or value == "":
        return None
    where = f"AGENTLOOP['PROVIDERS'][{provider!r}]['proxy'] (or proxy=)"
    url = _checked(value, where, _PROXY_SCHEMES, "http://gateway:3128")
    if url.lower().startswith("socks") and importlib.util.find_spec("socksio") is None:
        raise ConfigurationError(
            f"{where} is a SOCKS proxy, which needs httpx's socks extra: "
            'pip install "httpx[socks]"'
        )
    return url


def shown_address(base_url: Callable[[], str], proxy: object) -> str:
    """``base_url='...'`` (and ``proxy='...'``) for a provider's repr, passwords masked; a
    repr never raises, so a misconfigured URL shows as such (the call says what is wrong)."""
    try:
        url = masked(base_url())
    except ConfigurationError:
        url = "(misconfigured)"
    return f"base_url={url!r}" + (f" proxy={masked(str(proxy))!r}" if proxy else "")
