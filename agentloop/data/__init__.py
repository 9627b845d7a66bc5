"""Retention and erasure of what agentloop keeps about people (docs/data-retention.md).

    from agentloop import data

    document = data.export_owner(user)            # one JSON-ready dict
    data.write_export(user, open("42.json", "w"))  # the same, written a chat at a time
    report = data.erase_owner(user)               # keep_usage=True: usage rows anonymised
    data.delete_idle_chats(90)                    # default: AGENTLOOP["RETENTION_DAYS"]
    data.delete_expired_memories()                # (delete_idle_chats does it too)

Importing this module loads the models: import it once Django is set up.
"""

from .deletion import Deleted
from .erasure import ErasureReport, erase_owner
from .export import FORMAT, VERSION, export_owner, write_export
from .retention import (
    RetentionReport,
    delete_expired_memories,
    delete_idle_chats,
    expired_memories,
    idle_chats,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "Deleted",
    "ErasureReport",
    "RetentionReport",
    "delete_expired_memories",
    "delete_idle_chats",
    "erase_owner",
    "expired_memories",
    "export_owner",
    "idle_chats",
    "write_export",
]
