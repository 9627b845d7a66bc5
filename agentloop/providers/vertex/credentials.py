"""Google credentials for Vertex AI, all through google-auth: Application Default
Credentials, a credentials file (service account, authorized user, workload identity
federation), or a ``google.auth.credentials.Credentials`` object; and bearer tokens refreshed
before they expire, one refresh at a time.

google-auth is the ``vertex`` extra's: it is imported when credentials are first needed, and
its absence is a one-line ConfigurationError naming the extra.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ...exceptions import AuthenticationError, ConfigurationError, ServerError
from ..errors import redact

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


class GoogleCredentials:
    """Credentials loaded on first use from ``source``, and their current bearer token.

    ``source`` is a path to a credentials file, a google-auth ``Credentials`` object, or
    None for Application Default Credentials. ``client`` gives the httpx client google-auth's
    own requests go through. The token is kept here, in memory only.
    """

    def __init__(self, provider: str, source: Any, client: Callable[[], httpx.Client]) -> None:
        self.provider = provider
        self.source = source
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
        source = self.source
        try:
            if source is None:
                credentials, project = auth.default(scopes=[SCOPE], request=self._request())
            elif isinstance(source, str | Path):
                credentials, project = auth.load_credentials_from_file(
                    str(source), scopes=[SCOPE], request=self._request()
                )
            else:
                credentials, project = source, None
                if getattr(credentials, "requires_scopes", False):
                    credentials = credentials.with_scopes([SCOPE])
        except auth.exceptions.DefaultCredentialsError as exc:
            where = f"the file {source}" if isinstance(source, str | Path) else "ADC"
            raise ConfigurationError(
                f"No usable Google credentials for provider {self.provider!r} from {where}: "
                f"{exc} (see docs/providers/vertex-ai.md)"
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
