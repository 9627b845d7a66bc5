"""Google credentials for Vertex AI, all through google-auth: Application Default
Credentials, a credentials file (service account, authorized user, workload identity
federation), or a ``google.auth.credentials.Credentials`` object; and bearer tokens refreshed
before they expire, one refresh at a time.

google-auth is the ``vertex`` extra's: it is imported when credentials are first needed, and
its absence is a one-line ConfigurationError naming the extra.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ...exceptions import AuthenticationError, ConfigurationError, ServerError
from ..redaction import redact

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

__all__ = ["SCOPE", "GoogleCredentials", "google_auth"]

#: the OAuth scope Vertex AI's API takes.
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
INSTALL = "pip install 'django-agentloop[vertex]'"


def google_auth(provider: str) -> Any:
    """The ``google.auth`` module, or a one-line ConfigurationError naming the extra."""
    try:
        # Local: google-auth is optional (the vertex extra); only Vertex AI needs it.
        import google.auth
        import google.auth.exceptions
    except ImportError as exc:
        raise ConfigurationError(
            f"Provider {provider!r} (Vertex AI) needs google-auth: {INSTALL}"
        ) from exc
    return google.auth


def _external_account(info: dict[str, Any]) -> Any:
    """Workload identity federation: AWS, an executable, or a file or URL token source."""
    # Local: these google-auth modules are only needed for this kind of file.
    from google.auth import aws, identity_pool, pluggable

    source = info.get("credential_source") or {}
    if str(info.get("subject_token_type", "")).endswith(":aws4_request"):
        return aws.Credentials.from_info(info, scopes=[SCOPE])
    if isinstance(source, dict) and source.get("executable") is not None:
        return pluggable.Credentials.from_info(info, scopes=[SCOPE])
    return identity_pool.Credentials.from_info(info, scopes=[SCOPE])


def _from_file(path: str | Path) -> tuple[Any, str | None]:
    """Credentials and their project from a credentials file, by its ``type``, with
    google-auth's loader for that type (its catch-all loader is deprecated: it would accept
    any type from any file)."""
    # Local: google-auth is the vertex extra's (present: the caller imported it).
    from google.auth import external_account_authorized_user, impersonated_credentials
    from google.oauth2 import credentials as user
    from google.oauth2 import service_account

    try:
        info = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"can't read it as JSON ({type(exc).__name__})") from exc
    if not isinstance(info, dict):
        raise ValueError("it is not a JSON object")
    kind = info.get("type")
    project = info.get("project_id") or info.get("quota_project_id")
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(info, scopes=[SCOPE]), project
    if kind == "authorized_user":  # gcloud auth application-default login
        return user.Credentials.from_authorized_user_info(info), project
    if kind == "external_account":
        return _external_account(info), project
    if kind == "external_account_authorized_user":
        return external_account_authorized_user.Credentials.from_info(info), project
    if kind == "impersonated_service_account":
        found = impersonated_credentials.Credentials.from_impersonated_service_account_info
        return found(info, scopes=[SCOPE]), project
    raise ValueError(f"its type {kind!r} is not a kind of Google credentials file")


class GoogleCredentials:
    """Credentials loaded on first use from ``source``, and their current bearer token.

    ``source`` gives, when credentials are first needed, a path to a credentials file, a
    google-auth ``Credentials`` object, or None for Application Default Credentials.
    ``client`` gives the httpx client google-auth's own requests go through. The token is
    kept here, in memory only.
    """

    def __init__(
        self, provider: str, source: Callable[[], Any], client: Callable[[], httpx.Client]
    ) -> None:
        self.provider = provider
        self._source = source
        self._client = client
        self._credentials: Credentials | None = None
        self._project: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<GoogleCredentials of {self.provider!r}>"  # never the token

    def _request(self) -> Any:
        google_auth(self.provider)
        # Local: it imports google-auth, which the extra brings (checked just above).
        from .transport import HTTPXRequest

        return HTTPXRequest(self._client())

    def _load(self) -> Credentials:
        auth = google_auth(self.provider)
        source = self._source()
        try:
            if source is None:
                credentials, project = auth.default(scopes=[SCOPE], request=self._request())
            elif isinstance(source, str | Path):
                credentials, project = _from_file(source)
            else:
                credentials, project = source, None
                if getattr(credentials, "requires_scopes", False):
                    credentials = credentials.with_scopes([SCOPE])
        except (auth.exceptions.GoogleAuthError, ValueError, KeyError) as exc:
            where = f"the file {source}" if isinstance(source, str | Path) else "ADC"
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigurationError(
                f"No usable Google credentials for provider {self.provider!r} from {where}: "
                f'{reason} (see "Google Vertex AI" in the agentloop docs)'
            ) from exc
        self._project = project or getattr(credentials, "project_id", None) or None
        return credentials

    def credentials(self) -> Credentials:
        """The google-auth credentials (loaded on first use)."""
        with self._lock:
            if self._credentials is None:
                self._credentials = self._load()
            return self._credentials

    def project(self) -> str | None:
        """The project the credentials name (a service account's, ADC's), if any."""
        self.credentials()
        return self._project

    def token(self) -> str:
        """A bearer token valid for a few minutes more at least: google-auth's ``valid`` is
        false some minutes before expiry, and then it is refreshed, by one thread only."""
        credentials = self.credentials()
        auth = google_auth(self.provider)
        with self._lock:
            if not credentials.valid:
                try:
                    credentials.refresh(self._request())
                except auth.exceptions.RefreshError as exc:
                    raise AuthenticationError(
                        f"{self.provider}: Google refused to refresh the access token: "
                        f"{redact(str(exc), self.secrets())[:300]}"
                    ) from exc
                except auth.exceptions.TransportError as exc:
                    raise ServerError(
                        f"{self.provider}: could not refresh the access token: "
                        f"{redact(str(exc), self.secrets())[:300]}"
                    ) from exc
            token = credentials.token
        if not token:
            raise AuthenticationError(f"{self.provider}: the credentials gave no access token")
        return str(token)

    def secrets(self) -> tuple[str, ...]:
        """What must never be shown: the token and the credentials' own secrets, if loaded."""
        credentials = self._credentials
        if credentials is None:
            return ()
        found = (
            getattr(credentials, name, None) for name in ("token", "refresh_token", "client_secret")
        )
        return tuple(str(value) for value in found if value)
