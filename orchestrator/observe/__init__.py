"""Watching versions: measuring their lag against the log, and the agent's supervisor that
restarts the drivers of its host that died without a word."""
