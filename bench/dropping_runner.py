"""A runner that takes jobs and drops them: what a verb costs without its broker
(``bench/bulk_control.py``). Its own module, loaded by import path once Django is set up:
agentloop's runners can't be imported before that."""

from __future__ import annotations

from agentloop.runners.runner import Job, Runner


class DroppingRunner(Runner):
    """Takes jobs and drops them."""

    name = "dropping"

    def send(self, job: Job) -> None:
        return None
