"""Billing's agents."""

from agentloop import Agent


class Research(Agent):
    """Researches billing questions."""

    model = "agents:test"
    instructions = "You are BILLING RESEARCH."
