"""The Django store: a chat's transcript, usage and cancel flag in the database.

``store`` holds ``DjangoStore`` (the engine's store over the chat models), ``claims`` the
chat's claim (one writer), ``tool_calls`` the tool-call rows, ``rows`` the transcript's one
SELECT and its mapping to messages, ``sql`` the statements compiled once. Nothing is
imported here, so ``sql`` can be used by the lease module that ``store`` itself imports.
"""
