"""What agentloop serves over HTTP: the views of a chat, its live events, useChat."""
