"""Model calls from greenlets under gevent's monkey-patching, as a ``gevent`` pool runs steps:
``gevent_calls.py <base url of a keep-alive SSE server>``.

Eight in-memory chats ask at once with ``MODEL_CONCURRENCY = {"keepalive": 3}`` and a 2 s
``call_timeout``; then one more asks with no deadline and is cancelled from another greenlet.
Prints a last line ``SUMMARY {json}``: what each call raised, and the most calls that were
in the provider at once in this process (``most``: where the limit holds; the server's own
count lags, as a handler notices a timed-out client only at its next write).
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
    in_flight = {"now": 0, "most": 0}

    class Counted(OpenAIProvider):
        def request(self, request, *, on_chunk=None):  # type: ignore[no-untyped-def]
            in_flight["now"] += 1  # greenlets: no lock needed between two switches
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            try:
                return super().request(request, on_chunk=on_chunk)
            finally:
                in_flight["now"] -= 1

    providers.register("keepalive", Counted(base_url=url, api_key="test-key"))

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
    summary = {"outcomes": outcomes, "most": in_flight["most"]}
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
