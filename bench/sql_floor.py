"""The raw-SQL floor of bench/job_path.py: what a persisted step costs in psycopg alone.

Its own connection (autocommit, explicit BEGIN/COMMIT, client-side binding), no Django: per
step SELECT every column of the chat's messages ordered by id, INSERT the step's message,
UPDATE the chat row; in loop mode one SELECT per turn, then BEGIN, INSERT, UPDATE, COMMIT.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg


def floor_sql(message_table: str, chat_table: str, columns: list[str]) -> tuple[str, str, str]:
    """The floor's SELECT of a transcript, INSERT of a step's message and UPDATE of its chat
    (``%s`` parameters: the chat; chat, role, content, model, finish reason, time; time, chat)."""
    names = ", ".join(f'"{name}"' for name in columns)
    select = f'SELECT {names} FROM "{message_table}" WHERE "chat_id" = %s ORDER BY "id"'
    insert = (
        f'INSERT INTO "{message_table}" ("chat_id", "role", "content", "status", "is_error", '
        '"parsed", "model", "finish_reason", "thinking", "provider_data", "attachments", '
        '"created_at") '
        "VALUES (%s, %s, %s, 'complete', false, NULL, %s, %s, '', '{}'::jsonb, "
        "'[]'::jsonb, %s) "
        'RETURNING "id"'
    )
    update = f'UPDATE "{chat_table}" SET "updated_at" = %s WHERE "id" = %s'
    return select, insert, update


class Floor:
    """The least SQL a persisted step needs, on a psycopg connection of its own."""

    def __init__(
        self,
        url: str,
        message_table: str,
        chat_table: str,
        columns: list[str],
        turn: list[tuple[str, str, str, str]],
        question: str = "",
    ) -> None:
        self.turn_rows = turn
        self.question = question
        self.connection = psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor)
        self.cursor = self.connection.cursor()
        self.statements = 0
        self.select, self.insert, self.update = floor_sql(message_table, chat_table, columns)

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.statements += 1
        self.cursor.execute(sql, params)

    def _write(self, chat_pk: int, step: int) -> None:
        role, content, model, finish = self.turn_rows[step]
        now = datetime.now(UTC)
        self._execute(self.insert, (chat_pk, role, content, model, finish, now))
        self.cursor.fetchone()
        self._execute(self.update, (now, chat_pk))

    def turn(self, chat_pk: int) -> None:
        """Each step: BEGIN, SELECT the transcript, INSERT, UPDATE, COMMIT."""
        for step in range(len(self.turn_rows)):
            self._execute("BEGIN")
            try:
                self._execute(self.select, (chat_pk,))
                self.cursor.fetchall()
                self._write(chat_pk, step)
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self._execute("COMMIT")

    def ask_turn(self, chat_pk: int) -> None:
        """The user's message (BEGIN, INSERT, UPDATE, COMMIT), then :meth:`turn`."""
        now = datetime.now(UTC)
        self._execute("BEGIN")
        try:
            self._execute(self.insert, (chat_pk, "user", self.question, "", "", now))
            self.cursor.fetchone()
            self._execute(self.update, (now, chat_pk))
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self._execute("COMMIT")
        self.turn(chat_pk)

    def loop_turn(self, chat_pk: int) -> None:
        """Loop mode: one SELECT per turn, then BEGIN, INSERT, UPDATE, COMMIT per step."""
        self._execute(self.select, (chat_pk,))
        self.cursor.fetchall()
        for step in range(len(self.turn_rows)):
            self._execute("BEGIN")
            try:
                self._write(chat_pk, step)
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self._execute("COMMIT")
