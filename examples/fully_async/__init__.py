"""Fully asynchronous rollout example: a background worker generates while the trainer trains."""
