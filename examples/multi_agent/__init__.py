"""Multi-agent rollout example: solver, reviewer and finalizer share one team reward."""
