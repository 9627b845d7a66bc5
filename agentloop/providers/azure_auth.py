"""Microsoft Entra ID tokens for Azure AI Foundry: fetched through a credential, cached, and
refreshed before they expire.

A credential is anything with azure-core's ``get_token(*scopes)`` returning an object with
``token`` and ``expires_on`` (seconds since the epoch): ``DefaultAzureCredential`` (made here
when the settings say ``"credential": "entra"``), ``ManagedIdentityCredential``, a test
double. Only this option needs the ``azure-identity`` package (``django-agentloop[azure]``);
API keys need nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..exceptions import AuthenticationError, ConfigurationError

__all__ = ["ENTRA", "SCOPE", "EntraTokens", "TokenCredential", "credential_from"]

#: the token audience of Azure AI services (Foundry, Azure OpenAI, model inference).
SCOPE = "https://cognitiveservices.azure.com/.default"
#: the settings value asking for ``DefaultAzureCredential``.
ENTRA = "entra"
#: a token this close to its expiry (seconds) is replaced before it is used: a request
#: started with it could still be in flight when it runs out.
REFRESH_MARGIN = 300.0


@runtime_checkable
class TokenCredential(Protocol):
    """azure-core's credential protocol (the part used here)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        """An access token (``.token``, ``.expires_on``) for ``scopes``."""


def _default_credential() -> TokenCredential:
    try:
        # Local: azure-identity is an optional extra, needed only when Entra ID is chosen.
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise ConfigurationError(
            "Entra ID authentication for provider 'azure' needs the azure-identity package: "
            "pip install 'django-agentloop[azure]' (or use an API key)."
        ) from exc
    credential: TokenCredential = DefaultAzureCredential()
    return credential


def credential_from(value: Any, provider: str) -> TokenCredential | None:
    """The credential a setting names: None (use the API key), ``"entra"``
    (``DefaultAzureCredential``, made on first use) or a credential object."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and value.lower() == ENTRA:
        return _LazyDefault()
    if isinstance(value, TokenCredential):
        return value
    raise ConfigurationError(
        f"AGENTLOOP['PROVIDERS'][{provider!r}]['credential'] must be 'entra' or an object "
        f"with get_token(), not {type(value).__name__}"
    )


class _LazyDefault:
    """``DefaultAzureCredential``, made when the first token is needed (not at import or
    provider creation, so a project without azure-identity fails only when it is used)."""

    def __init__(self) -> None:
        self._credential: TokenCredential | None = None

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        if self._credential is None:
            self._credential = _default_credential()
        return self._credential.get_token(*scopes, **kwargs)


class EntraTokens:
    """One credential's bearer token for :data:`SCOPE`, shared by every request of a provider
    (thread-safe) and replaced :data:`REFRESH_MARGIN` seconds before it expires."""

    def __init__(
        self, credential: TokenCredential, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._credential = credential
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0

    def fresh(self) -> bool:
        """Whether the cached token can be used without asking the credential again."""
        return self._token is not None and self._expires_on - REFRESH_MARGIN > self._clock()

    def cached(self) -> str | None:
        """The token last fetched (for redacting it from errors), or None."""
        return self._token

    def token(self) -> str:
        """A token valid for a while yet; fetched (blocking) when there is none."""
        with self._lock:
            if not self.fresh():
                self._token, self._expires_on = self._fetch()
            assert self._token is not None
            return self._token

    def _fetch(self) -> tuple[str, float]:
        try:
            access = self._credential.get_token(SCOPE)
        except ConfigurationError:
            raise
        except Exception as exc:  # azure-identity raises its own kinds; say which, once
            raise AuthenticationError(
                f"azure: could not get a Microsoft Entra ID token "
                f"({type(exc).__name__}): {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
        token = getattr(access, "token", None)
        expires_on = getattr(access, "expires_on", None)
        if not isinstance(token, str) or not token or not isinstance(expires_on, int | float):
            raise AuthenticationError(
                "azure: the credential's get_token() returned no token and expiry "
                f"(a {type(access).__name__})"
            )
        return token, float(expires_on)
