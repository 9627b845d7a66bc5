"""The Django store: a chat's transcript, usage and cancel flag in the database.

``database`` holds ``DjangoStore`` (the engine's store over the chat models), composed of
parts that each own their state: ``chat_row`` (the chat, its models, the rows built for it),
``configuration`` (configuration and tools), ``run_control`` (the claim, one writer, and
every write under it; ``releases`` says how a verb's release ends), ``transcript`` (messages
and usage), ``tool_calls`` (tool-call rows), ``stopping`` (cancel, halt) and ``inbox``
(messages queued while a run holds the chat). ``writes`` builds a step's one-statement
writes, ``transcript_rows`` the transcript's one SELECT and its mapping to messages, ``sql``
the statements compiled once. Nothing is imported here, so ``sql`` can be used by the lease
module that ``database`` itself imports.
"""
