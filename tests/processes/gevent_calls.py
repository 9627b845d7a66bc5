"""Model calls from greenlets under gevent's monkey-patching, as a ``gevent`` pool runs steps:
``gevent_calls.py <base url of a keep-alive SSE server>``.

Eight in-memory chats ask at once with ``MODEL_CONCURRENCY = {"keepalive": 3}`` and a 2 s
``call_timeout``; then one more asks with no deadline and is cancelled from another greenlet.
Prints a last line ``SUMMARY {json}``: what each call raised.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402 - after the patching, as a gevent worker does
import sys  # noqa: E402

import django  # noqa: E402
import gevent  # noqa: E402


def main(url: str) -> None:
    django.setup()
    from django.conf import settings

    import agentloop
    from agentloop import providers
    from agentloop.conf import agentloop_settings
    from agentloop.providers.openai import OpenAIProvider

    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "MODEL_RETRIES": 0,
        "MODEL_CONCURRENCY": {"keepalive": 3},
        "PROVIDERS": {"keepalive": {"call_timeout": 2}},
    }
    agentloop_settings.reload()
    providers.register("keepalive", OpenAIProvider(base_url=url, api_key="test-key"))

    def ask(chat: agentloop.Conversation) -> str:
        try:
            chat.ask("Hi", stream=lambda chunk: None)
        except Exception as exc:  # noqa: BLE001 - reported
            return f"{type(exc).__name__}: {exc}"
        return "answered"

    bounded = [gevent.spawn(ask, agentloop.chat("keepalive:model")) for _ in range(8)]
    gevent.joinall(bounded, timeout=60)

    settings.AGENTLOOP = {**settings.AGENTLOOP, "PROVIDERS": {}, "MODEL_CONCURRENCY": {}}
    agentloop_settings.reload()
    chat = agentloop.chat("keepalive:other")
    cancelled = gevent.spawn(ask, chat)
    gevent.sleep(1)  # the call is in flight (comments only) by now
    chat.cancel()
    cancelled.join(timeout=60)
    outcomes = [g.value if g.ready() else "still running" for g in [*bounded, cancelled]]
    print("SUMMARY " + json.dumps({"outcomes": outcomes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
