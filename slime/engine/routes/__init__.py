"""The engine server's routes by concern: generation, control (health, info, cache, pause,
memory), and weights (updates from tensors, disk, or a distributed group)."""
