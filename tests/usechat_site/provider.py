"""The model behind the React page's chats: it answers by the latest user message.

``add``: calls the ``add`` tool, then says the sum. ``pay``: calls ``transfer``, which waits
for a person's approval, then reports its result. ``story``: a slow streamed answer (a
word every 0.25 s: long enough to cancel it or reload the page in the middle). Anything
else: "You said: <the message>".
"""

from __future__ import annotations

from typing import Any

from agentloop.messages import ModelRequest
from agentloop.testing import FunctionProvider, reply, stream, tool_call

#: the slow answer, word by word.
STORY = (
    "Once upon a time there was a chat that streamed its answer one word at a time until the end."
)
WORD_DELAY = 0.25


def answer(request: ModelRequest) -> Any:
    messages = [m for m in request.messages if m.is_finished]
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    asked = messages[last_user].content.strip()
    results = [m for m in messages[last_user + 1 :] if m.role == "tool"]
    if asked == "add":
        if not results:
            return tool_call("add", {"a": 2, "b": 3}, id=f"add-{last_user}")
        return reply(f"2 + 3 = {results[-1].content}.")
    if asked == "pay":
        if not results:
            return tool_call("transfer", {"amount": 5, "to": "bob"}, id=f"pay-{last_user}")
        return reply(f"Done: {results[-1].content}.")
    if asked == "story":
        words = STORY.split(" ")
        return stream(*[w + " " for w in words[:-1]], words[-1], delay=WORD_DELAY)
    return reply(f"You said: {asked}")


provider = FunctionProvider(answer)
