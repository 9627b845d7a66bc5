"""AWS credentials, region and SigV4 signing for Bedrock, all through botocore.

botocore resolves the credentials (the standard chain: environment, shared config and
credentials files and their profiles, SSO, web identity, container and instance roles) and
refreshes them when they expire; they are read at each request, kept nowhere else, and
never logged or shown. Signing is botocore's ``SigV4Auth`` over an ``AWSRequest``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ...exceptions import AuthenticationError, ConfigurationError

__all__ = ["EXTRA_HINT", "SERVICE", "AWSAuth", "require_botocore"]

#: the SigV4 service name of the Bedrock runtime.
SERVICE = "bedrock"
EXTRA_HINT = 'pip install "django-agentloop[bedrock]"'


def require_botocore() -> ModuleType:
    """botocore, or ConfigurationError saying which extra brings it."""
    try:
        # Optional dependency: only Bedrock needs it, so it is imported when Bedrock is used.
        import botocore.auth
        import botocore.awsrequest
        import botocore.eventstream
        import botocore.session
    except ImportError as exc:
        raise ConfigurationError(
            f"The bedrock provider needs botocore, which is not installed: {EXTRA_HINT}"
        ) from exc
    return botocore


class _HideCanonicalRequest(logging.Filter):
    """botocore logs each canonical request at DEBUG, session token included, and each
    request's signature: drop them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("CanonicalRequest", "StringToSign", "Signature"))


_filter_lock = threading.Lock()
_filtered = False


def _hide_canonical_requests() -> None:
    global _filtered
    with _filter_lock:
        if not _filtered:
            logging.getLogger("botocore.auth").addFilter(_HideCanonicalRequest())
            _filtered = True


class AWSAuth:
    """Where a Bedrock provider's credentials and region come from, and its signer.

    ``session`` is a ``botocore.session.Session`` to use (else one is made, with
    ``profile`` when given). The region is ``region``, else ``AWS_REGION``, else what
    botocore finds (``AWS_DEFAULT_REGION``, the profile's ``region``).
    """

    def __init__(
        self, *, region: str | None = None, profile: str | None = None, session: Any = None
    ) -> None:
        self._region = region
        self._profile = profile
        self._session = session
        self._lock = threading.Lock()
        #: whether a request was signed (so credentials were resolved and sent).
        self.signed = False

    def __repr__(self) -> str:  # never the credentials
        return f"<AWSAuth region={self._region!r} profile={self._profile!r}>"

    @property
    def session(self) -> Any:
        """The botocore session, made on first use."""
        with self._lock:
            if self._session is None:
                botocore = require_botocore()
                self._session = botocore.session.Session(profile=self._profile or None)
            return self._session

    def region(self) -> str | None:
        """The region requests are signed for (None: none could be found)."""
        region = self._region or os.environ.get("AWS_REGION")
        if not region:
            region = self.session.get_config_variable("region")
        return str(region) if region else None

    def credentials(self) -> Any:
        """Frozen credentials for one request (botocore refreshes expiring ones)."""
        try:
            found = self.session.get_credentials()
        except Exception as exc:  # botocore's own errors: a bad profile, SSO expired...
            raise AuthenticationError(
                f"bedrock: AWS credentials could not be loaded ({type(exc).__name__})"
            ) from None
        if found is None:
            raise AuthenticationError(
                "bedrock: no AWS credentials found (environment variables, shared "
                "credentials or config file, or an instance or container role)"
            )
        try:
            return found.get_frozen_credentials()
        except Exception as exc:  # a refresh that failed
            raise AuthenticationError(
                f"bedrock: AWS credentials could not be refreshed ({type(exc).__name__})"
            ) from None

    def sign(
        self, url: str, content: bytes, headers: Mapping[str, str], region: str
    ) -> dict[str, str]:
        """``headers`` plus the SigV4 headers of a POST of ``content`` to ``url``."""
        botocore = require_botocore()
        _hide_canonical_requests()
        request = botocore.awsrequest.AWSRequest(
            method="POST", url=url, data=content, headers=dict(headers)
        )
        botocore.auth.SigV4Auth(self.credentials(), SERVICE, region).add_auth(request)
        self.signed = True
        return dict(request.headers.items())
