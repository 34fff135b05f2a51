"""Watching versions: lag math, measuring it, and the agent that keeps drivers running."""
