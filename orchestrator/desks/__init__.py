"""What the facade hands requests to: the switch desk (read aliases) and the outcome desk
(outcome metrics and experiments)."""
