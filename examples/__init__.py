"""Runnable examples (hooks are loaded by dotted path, e.g. `examples.search_r1.generate.generate`)."""
