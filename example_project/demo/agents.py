"""The example site's agents: an assistant with the demo tools and a researcher subagent.

Their model is the project's ``DEFAULT_MODEL`` (``"demo:rule-based"`` unless the
``AGENTLOOP_MODEL`` environment variable names a real one), read when a chat is made.
"""

from __future__ import annotations

import agentloop
from agentloop.tools import AskPerson

from .tools import DeleteNotes, ListNotes, SaveNote, Weather, calculator


class Researcher(agentloop.Agent):
    """Researches a question with its own tools and reports back in a few sentences."""

    instructions = (
        "You are a careful researcher. Use the weather tool for anything about the weather. "
        "Report what you found in two or three sentences."
    )
    tools = [Weather]


class Assistant(agentloop.Agent):
    """The example site's assistant."""

    instructions = (
        "You are the helpful assistant of the agentloop example site. Use the calculator for "
        "arithmetic and the weather tool for the weather. Keep notes for the user with "
        "save_note and list_notes; delete_notes deletes them all and needs the user's "
        "approval. When you need to know something from the user, use ask_person. Hand "
        "research tasks to the researcher."
    )
    tools = [calculator, Weather, SaveNote, ListNotes, DeleteNotes, AskPerson, Researcher]
