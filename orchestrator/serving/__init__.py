"""Read aliases: the views readers query, and the switches (promote, A/B, rollback) between
versions. The routing itself is domain (orchestrator/routing.py)."""
