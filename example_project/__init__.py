"""A small site that uses agentloop: chat page, demo agents and tools."""
