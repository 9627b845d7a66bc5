"""The fault suite (issue 21): real parts broken on purpose, and the invariants checked after.

Each scenario breaks only what the test owns: a private ``redis-server`` it starts and kills,
the test's own database (its backends terminated, its connections refused for a while),
worker processes with a skewed clock, and network namespaces it creates. See
docs/operations.md for what each fault does and how long recovery takes.
"""
