"""What is redacted, in one place: the credentials a provider holds or sends, removed from
every error text built from what came back (docs/providers/index.md, "What is redacted").

Two layers, both in :func:`redact`:

- the literal secrets a provider knows: its API key, the user and password of its endpoint
  and proxy URLs (and the ``Basic`` token they become), the credential headers it sends
  (configured ``headers`` included), and whatever its family declares (an OAuth token, AWS
  keys, an Entra ID token), each also as it looks percent-encoded or inside JSON;
- the shapes of credentials, for what nobody told us: vendor key prefixes, ``Bearer`` and
  ``Basic`` tokens, SigV4's ``Credential=`` and ``Signature=``, AWS access key ids, Google
  OAuth tokens, ``key=``-style query parameters, a URL's ``user:password@``, and the value of
  any credential-named header echoed as ``Name: value`` or ``"name": "value"``.

:meth:`.http.HTTPProvider._secrets` gathers the first for every family;
:func:`.errors.call_errors` applies both to every error leaving a call.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, quote, unquote, urlsplit

__all__ = [
    "REDACTED",
    "hide_url_credentials_in_logs",
    "is_credential_name",
    "redact",
    "redact_error",
    "secrets_sent",
    "url_secrets",
]

REDACTED = "[redacted]"

# A header's or parameter's name that ends in one of these words (after "-" or "_", or
# alone) names a credential: Authorization, Proxy-Authorization, x-api-key, api-key,
# x-goog-api-key, X-Amz-Security-Token, Cookie, a gateway's X-Portkey-Api-Key or
# cf-aig-authorization; key=, access_token=, client_secret=, SigV4's Credential= and Signature=.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|[_-])(?:auth\w{0,20}|api[_-]?key|key|token|secret|passw(?:or)?d|signature|sig"
    r"|credential|cookie)$",
    re.IGNORECASE,
)
# Secrets shorter than this are not looked for as text: they would mask ordinary words.
_SHORTEST = 4

# A URL's user and password (or a lone user, which may be a token).
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.\-]{0,20}://)[^/\s@\"'?#]{1,256}(?=@)")
# Credentials by their shape: each pattern keeps its first group and masks the rest.
_SHAPES = (
    re.compile(r"(sk-(?:ant-(?:api\d+-)?|proj-|or-(?:v1-)?)?)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(AIza)[A-Za-z0-9_\-]{20,}"),
    re.compile(r"(ya29\.)[A-Za-z0-9_.\-]{8,}"),  # a Google OAuth access token
    re.compile(r"()\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),  # an AWS access key id
    re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE),
    # Base64 of user:password (with a digit or +/=, so "basic authentication" stays).
    re.compile(r"(\bBasic\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{6,}={0,2}"),
    _USERINFO,
)
_SCHEME = r"(?:(?:Bearer|Basic|AWS4-HMAC-SHA256)\s+)?"
# Values after a name: groups (before, name, between, value); the value is masked when the
# name is a credential's. Names start where a run of name characters starts, so a long
# text is read once.
_NAMED = (
    # name=value: a query, a form, SigV4's Credential= and Signature=.
    re.compile(r"()(?<![\w.-])([\w.-]{1,80})(=)([^&\s\"',;]+)"),
    # "name": "value", as JSON (or a dict's repr) repeats a header or a field.
    re.compile(rf"([\"'])([\w-]{{1,80}})([\"']\s*:\s*[\"']{_SCHEME})([^\"']+)"),
    # Name: value, as a header line (the value's first word, after its scheme).
    re.compile(rf"()(?<![\w-])([\w-]{{1,80}})(:[ \t]*{_SCHEME})([^\s;,\"'}}]+)"),
)


def is_credential_name(name: str) -> bool:
    """Whether a header or query parameter called ``name`` carries a credential."""
    return bool(_CREDENTIAL_NAME.search(name.strip()))


def _masked_value(match: re.Match[str]) -> str:
    before, name, between, _ = match.groups()
    return before + name + between + REDACTED if is_credential_name(name) else match.group(0)


def _forms(secret: str) -> Iterable[str]:
    """``secret`` as an error could repeat it: as is, percent-encoded, inside JSON."""
    yield secret
    yield quote(secret, safe="")
    yield json.dumps(secret)[1:-1]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with ``secrets`` and anything shaped like a credential replaced by
    ``[redacted]``: the one redaction every provider family's errors go through."""
    literal = {form for secret in secrets if secret for form in _forms(str(secret))}
    for secret in sorted(literal, key=len, reverse=True):  # a longer one may hold a shorter
        if len(secret) >= _SHORTEST:
            text = text.replace(secret, REDACTED)
    for shape in _SHAPES:
        text = shape.sub(lambda match: match.group(1) + REDACTED, text)
    for named in _NAMED:
        text = named.sub(_masked_value, text)
    return text


def redact_error(error: BaseException, secrets: Iterable[str] = ()) -> None:
    """Redact, in place, ``error``'s message (and a ProviderError's ``body``) and those of
    the exceptions it was raised from, as a traceback shows them (``error_detail``). A
    linked exception whose text can't be rewritten is unlinked rather than shown."""
    given = tuple(secrets)
    seen: set[int] = set()
    current: BaseException | None = error
    previous: BaseException | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(
            redact(arg, given) if isinstance(arg, str) else arg for arg in current.args
        )
        body = getattr(current, "body", None)
        if isinstance(body, str):
            current.body = redact(body, given)  # type: ignore[attr-defined]
        shown = str(current)
        if previous is not None and redact(shown, given) != shown:
            previous.__cause__ = previous.__context__ = None
            previous.__suppress_context__ = True
            return
        previous = current
        suppressed = current.__suppress_context__ and current.__cause__ is None
        current = current.__cause__ or (None if suppressed else current.__context__)


def url_secrets(value: object) -> tuple[str, ...]:
    """The credentials of a URL (an endpoint or a proxy) an error could repeat: its password
    (or a lone user, which may be a token) as written and decoded, the ``Basic`` token
    they make, and its credential-named query parameters. Never raises."""
    if not isinstance(value, str):
        return ()
    try:
        parts = urlsplit(value)
        user, password = parts.username, parts.password
        query = parse_qsl(parts.query)
    except ValueError:
        return ()
    found = [given for name, given in query if is_credential_name(name)]
    secret = password or user
    if secret:
        token = f"{unquote(user or '')}:{unquote(password or '')}".encode()
        found += [secret, unquote(secret), base64.b64encode(token).decode("ascii")]
    return tuple(dict.fromkeys(found))


def secrets_sent(headers: Mapping[str, str], url: str = "") -> tuple[str, ...]:
    """The credentials one request carried: each credential header's value and the token
    after its scheme word (``Bearer``, ``Basic``, SigV4's ``Credential=`` and ``Signature=``),
    and the credentials of its URL."""
    found: list[str] = []
    for name, value in headers.items():
        if not is_credential_name(name) or not isinstance(value, str):
            continue
        found.append(value)
        _, _, token = value.partition(" ")
        found += [token] if token else []
        for part in token.split(","):  # SigV4: Credential=..., SignedHeaders=..., Signature=...
            field, equals, signed = part.strip().partition("=")
            found += [signed] if equals and signed and is_credential_name(field) else []
    found += url_secrets(url)
    return tuple(dict.fromkeys(secret for secret in found if secret))


class _HideURLCredentials(logging.Filter):
    """httpx logs each request's URL at INFO, an endpoint's ``user:password@`` included:
    masked (the record is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _USERINFO.sub(r"\1" + REDACTED, str(arg)) if "@" in str(arg) else arg
                for arg in record.args
            )
        return True


_filter_lock = threading.Lock()
_filtered = False


def hide_url_credentials_in_logs() -> None:
    """Mask the credentials of URLs in httpx's log records (once per process)."""
    global _filtered
    if _filtered:
        return
    with _filter_lock:
        if not _filtered:
            logging.getLogger("httpx").addFilter(_HideURLCredentials())
            _filtered = True
