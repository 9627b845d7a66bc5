"""Legal's agents."""

from agentloop import Agent


class Research(Agent):
    """Researches legal questions."""

    model = "agents:test"
    instructions = "You are LEGAL RESEARCH."
