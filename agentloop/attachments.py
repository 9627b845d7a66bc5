"""Attachments: images and documents sent along with a message, and parsing what users pass.

``Attachment`` is the pydantic type a :class:`~agentloop.messages.Message` carries;
:func:`attachments_from` turns what ``ask_later(..., attachments=...)`` accepts (Attachments,
http(s) or ``data:`` URLs, ``pathlib.Path`` objects) into a list of them.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote_to_bytes, urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    field_serializer,
    field_validator,
    model_validator,
)

from .exceptions import AttachmentError

__all__ = ["FILE_TYPES", "IMAGE_TYPES", "Attachment", "attachments_adapter", "attachments_from"]


#: image types every supported provider reads.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: document types every supported provider reads.
FILE_TYPES = frozenset({"application/pdf"})
_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "application/x-pdf": "application/pdf",
}


def _media_type(value: str) -> str:
    """``"Image/JPG; q=1"`` -> ``"image/jpeg"``."""
    plain = value.split(";", 1)[0].strip().lower()
    return _ALIASES.get(plain, plain)


def _guess_type(location: str) -> str | None:
    guessed, _ = mimetypes.guess_type(location, strict=False)
    return _media_type(guessed) if guessed else None


def _supported() -> str:
    return ", ".join(sorted(IMAGE_TYPES | FILE_TYPES))


class Attachment(BaseModel):
    """An image or a document sent along with a message: by ``url``, or as ``data`` bytes.

    ``kind`` follows from ``media_type`` (``image/*``: "image"; ``application/pdf``:
    "file"). A ``data:`` URL is read into ``data`` and ``media_type``. In JSON ``data`` is
    base64. Build one with :meth:`from_path`, :meth:`from_bytes` or :meth:`from_url`, or
    pass a URL string or a ``pathlib.Path`` to ``ask_later(..., attachments=[...])``.
    Unsupported types raise :class:`~agentloop.exceptions.AttachmentError`.
    """

    model_config = ConfigDict(extra="forbid")

    #: "image" or "file" (a document); set from ``media_type`` when not given.
    kind: Literal["image", "file"] | None = None
    url: str | None = None
    data: bytes | None = None
    media_type: str | None = None
    #: a file name, sent where the API takes one (documents).
    name: str | None = None
    #: OpenAI's image detail ("auto", "low", "high"); other providers ignore it.
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("data", mode="before")
    @classmethod
    def _from_base64(cls, value: Any) -> Any:
        # In JSON (and when given as text) the bytes are standard base64.
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise AttachmentError(f"Attachment data is not valid base64: {exc}") from None
        return value

    @field_serializer("data", when_used="json")
    def _to_base64(self, value: bytes | None) -> str | None:
        return None if value is None else base64.b64encode(value).decode("ascii")

    @model_validator(mode="after")
    def _check(self) -> Attachment:
        if (self.url is None) == (self.data is None):
            raise AttachmentError("An attachment needs exactly one of url or data.")
        if self.url is not None and self.url.startswith("data:"):
            self.data, media_type = _parse_data_url(self.url)
            self.url = None
            self.media_type = self.media_type or media_type
        if self.url is not None:
            scheme = urlparse(self.url).scheme
            if scheme not in ("http", "https"):
                raise AttachmentError(
                    f"Attachment URL {self.url[:100]!r} is not http(s); pass a "
                    "pathlib.Path for a local file, or the bytes with their media_type."
                )
            if self.media_type is None:
                self.media_type = _guess_type(urlparse(self.url).path)
        label = self.name or (self.url[:100] if self.url else "data")
        if self.media_type is None:
            if self.kind is None or self.data is not None:
                raise AttachmentError(
                    f"Can't tell the type of attachment {label!r}: give its media_type "
                    f"(one of {_supported()})."
                )
            return self  # a URL of a known kind: the provider reads its type
        media_type = _media_type(self.media_type)
        if media_type in IMAGE_TYPES:
            kind: Literal["image", "file"] = "image"
        elif media_type in FILE_TYPES:
            kind = "file"
        else:
            raise AttachmentError(
                f"Unsupported attachment type {media_type!r} ({label}); agentloop sends "
                f"{_supported()}."
            )
        if self.kind is not None and self.kind != kind:
            raise AttachmentError(f"Attachment {label!r} is a {media_type}, not a {self.kind}.")
        self.media_type, self.kind = media_type, kind
        return self

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_path(
        cls, path: str | Path, *, media_type: str | None = None, name: str | None = None
    ) -> Attachment:
        """A local file's bytes; the type is guessed from its name unless given."""
        path = Path(path)
        media_type = media_type or _guess_type(path.name)
        return cls(data=path.read_bytes(), media_type=media_type, name=name or path.name)

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str, *, name: str | None = None) -> Attachment:
        return cls(data=data, media_type=media_type, name=name)

    @classmethod
    def from_url(
        cls, url: str, *, media_type: str | None = None, name: str | None = None
    ) -> Attachment:
        """An http(s) URL the provider fetches (type guessed from the path unless given),
        or a ``data:`` URL."""
        return cls(url=url, media_type=media_type, name=name)

    # -- for providers ----------------------------------------------------------------------
    @property
    def size(self) -> int | None:
        """Bytes of ``data`` (None for a URL)."""
        return None if self.data is None else len(self.data)

    def base64(self) -> str:
        """``data`` as base64 text."""
        return base64.b64encode(self.data or b"").decode("ascii")

    def data_url(self) -> str:
        """``data:<media type>;base64,...``, or the URL itself."""
        if self.url is not None:
            return self.url
        return f"data:{self.media_type};base64,{self.base64()}"

    def filename(self) -> str:
        """``name``, else a name made from the kind and the media type's usual extension."""
        if self.name:
            return self.name
        extension = mimetypes.guess_extension(self.media_type or "") or ""
        return f"{'image' if self.kind == 'image' else 'document'}{extension}"


def attachments_from(value: Any, *, max_bytes: int | None = None) -> list[Attachment]:
    """What ``ask_later(..., attachments=...)`` takes, as Attachments.

    ``value``: one item or a list of them, each an :class:`Attachment`, an http(s) or
    ``data:`` URL string, or a ``pathlib.Path`` (read here; type guessed from its name).
    Strings are never read as file paths. ``max_bytes`` caps each attachment's data.
    """
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    attachments: list[Attachment] = []
    for item in items:
        if isinstance(item, Attachment):
            attachment = item
        elif isinstance(item, os.PathLike):
            path = Path(item)
            size = path.stat().st_size
            if max_bytes is not None and size > max_bytes:
                raise AttachmentError(
                    f"{path.name} is {size} bytes; attachments may have at most "
                    f"{max_bytes} (AGENTLOOP['MAX_ATTACHMENT_BYTES'])."
                )
            attachment = Attachment.from_path(path)
        elif isinstance(item, str):
            if not item.startswith(("http://", "https://", "data:")):
                raise AttachmentError(
                    f"Attachment {item[:100]!r} is not an http(s) or data: URL; for a local "
                    "file pass pathlib.Path(...) (strings are never read as paths)."
                )
            attachment = Attachment.from_url(item)
        elif isinstance(item, bytes | bytearray):
            raise AttachmentError(
                "Bytes need their media type: pass Attachment(data=..., media_type=...)."
            )
        else:
            raise AttachmentError(
                f"Can't attach a {type(item).__name__}: pass an Attachment, a URL or a "
                "pathlib.Path."
            )
        if max_bytes is not None and attachment.size is not None and attachment.size > max_bytes:
            raise AttachmentError(
                f"Attachment {attachment.filename()!r} is {attachment.size} bytes; attachments "
                f"may have at most {max_bytes} (AGENTLOOP['MAX_ATTACHMENT_BYTES'])."
            )
        attachments.append(attachment)
    return attachments


def _parse_data_url(url: str) -> tuple[bytes, str | None]:
    header, comma, payload = url.partition(",")
    if not comma:
        raise AttachmentError("A data: URL needs a comma before its data.")
    meta = header[len("data:") :].split(";")
    media_type = meta[0] or None
    if "base64" in meta[1:]:
        try:
            return base64.b64decode(payload, validate=True), media_type
        except binascii.Error as exc:
            raise AttachmentError(f"The data: URL's base64 is invalid: {exc}") from None
    return unquote_to_bytes(payload), media_type


attachments_adapter: TypeAdapter[list[Attachment]] = TypeAdapter(list[Attachment])
