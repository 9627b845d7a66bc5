"""What one process shares across the steps it runs, made once per process (and again after
a fork): the Redis client (:mod:`.redis_client`), the bounded publisher of live events
(:mod:`.event_publisher`), the cancel-notice subscriber (:mod:`.cancel_notices`), on the
holder in :mod:`.per_process` (the model-call watchdog and the MCP loop use it too)."""
