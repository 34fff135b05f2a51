"""A job version's life: deploy, restart, stop, and what is reported about it."""
