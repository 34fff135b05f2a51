"""Resumable plans of stages: the cutover (validate, ramp, soak, promote), the outcome
experiment's looks, and lag waits."""
