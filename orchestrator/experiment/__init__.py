"""Cutover by outcome: metrics, attribution, sequential statistics, the bandit and the policy
(the domain: pure, no driver library)."""
