"""Evals from the chats agentloop stores: replay stored turns against a candidate model,
prompt or toolset, score the answers and compare runs (docs/evals.md).

Modules, by concept:

- ``replay``: one turn answered by a candidate in memory, tools answered from the recording;
- ``scorers``: the scorer kinds and how a case's outcome is scored;
- ``sets``: eval sets from stored chats or a JSONL file (uses the models);
- ``runs``: a run's cases, sent one per job, and the job body (uses the models);
- ``reports``: a run's figures and the comparison of two runs (uses the models);
- ``tasks``: the Celery task, registered by ``agentloop.tasks``.

This package imports no models itself, so the task module loads before the app registry.
"""

from .replay import NO_RECORDING, Attempt, Candidate, Recording, Turn, replay
from .scorers import Outcome, Score, check_scorers, score_outcome

__all__ = [
    "NO_RECORDING",
    "Attempt",
    "Candidate",
    "Outcome",
    "Recording",
    "Score",
    "Turn",
    "check_scorers",
    "replay",
    "score_outcome",
]
