"""Search-R1 style retrieval-augmented generation: a multi-turn hook, a local BM25 server, an EM reward."""
