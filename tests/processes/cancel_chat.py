"""Cancel a chat from a process of its own, as a cancel view in another web process does:
``cancel_chat.py <chat pk>``. Prints ``SUMMARY {"cancelled": <what cancel() returned>}``.
"""

from __future__ import annotations

import json
import sys

import django


def main(chat_pk: int) -> None:
    django.setup()
    from agentloop.models import Chat

    cancelled = Chat.objects.get(pk=chat_pk).cancel()
    print("SUMMARY " + json.dumps({"cancelled": cancelled}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
