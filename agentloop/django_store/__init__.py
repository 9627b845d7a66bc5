"""The Django store: a chat's transcript, usage and cancel flag in the database.

``store`` holds :class:`DjangoStore` (the engine's store over the chat models), ``rows`` the
transcript's one SELECT and its mapping to messages, ``sql`` the statements compiled once.
"""

from .store import DjangoStore

__all__ = ["DjangoStore"]
