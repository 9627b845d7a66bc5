"""AWS Bedrock, the Converse API (``/model/{id}/converse`` and ``/converse-stream``).

Model strings are ``bedrock:<model id or inference profile>``
(``bedrock:us.amazon.nova-2-lite-v1:0``).
Requests are signed with SigV4 by botocore, with credentials from the standard AWS chain
(:mod:`.signing`); streamed answers are binary event-stream frames decoded by botocore
(:mod:`.stream`).

Mapping, in short: system messages become ``system`` text blocks; user text and
attachments (``image`` and ``document`` blocks, bytes or ``s3Location``) a ``user`` message;
assistant answers ``text`` and ``toolUse`` blocks; the results of a round one ``user``
message of ``toolResult`` blocks (``status: "error"`` for errors). Tools are ``toolSpec``
entries with their JSON schema; tool choice is ``auto``, ``any`` or one ``tool`` ("none"
has no Converse equivalent: the tools are sent without a choice). Structured output is
``outputConfig.textFormat`` (a JSON schema). ``with_thinking`` becomes
``additionalModelRequestFields``: ``reasoning_config`` (a budget) for Claude,
``reasoningConfig`` (an effort) for Nova 2. ``reasoningContent`` blocks of an answer (with
their signatures) are kept in ``provider_data`` and sent back as received, to this provider
only (:mod:`agentloop.providers.thinking`). ``with_caching`` adds ``cachePoint`` blocks
after the tools (Claude), the system prompt and the latest message.

The package: ``provider`` (``BedrockProvider``: HTTP, signing hooks, errors, prices),
``mapping`` (the request body), ``answer`` (responses and stream events), ``stream`` (the
event-stream decoder) and ``signing`` (credentials, region, SigV4).
"""

from .mapping import CONTENT_KEY
from .provider import BedrockProvider, base_model

__all__ = ["CONTENT_KEY", "BedrockProvider", "base_model"]
