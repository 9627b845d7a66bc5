"""A package with its own ``Research`` agent (tool name clashes, tests/test_agents.py)."""
