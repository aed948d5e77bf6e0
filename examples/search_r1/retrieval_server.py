"""A small local retrieval server: BM25 over a JSONL corpus, answered over HTTP.

The Search-R1 hook (`examples/search_r1/generate.py`) calls it while the model generates, so the
search tool is a real service with real latency, not a function call. Ranking is Okapi BM25,
written out below in plain Python: the corpus is a few dozen passages, nothing more is needed.

    python -m examples.search_r1.retrieval_server --port 8765 [--host 127.0.0.1] [--corpus FILE]

API (JSON):
    GET  /health    -> {"status": "ok", "num_docs": N, "requests": number of /retrieve calls so far}
    POST /retrieve  {"queries": ["red planet", ...], "topk": 2}
                    -> {"result": [[{"id", "title", "text", "score", "contents"}, ...], ...]}  (one list
                       per query, best first; passages with no query term in common are left out;
                       "contents" is '"title"\ntext', the field Search-R1's own retrieval server
                       returns, so slime's search-r1 example's client reads these results too)

Corpus lines: {"id": ..., "title": ..., "text": ...}; the title is indexed with the text.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

DEFAULT_CORPUS = Path(__file__).with_name("corpus.jsonl")
MAX_TOPK = 20

# Words that carry no topic: indexing them only adds noise to a tiny corpus.
_STOP_WORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or that the this to "
    "was were what when where which who whom why with".split()
)
_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric words without stop words (the same for documents and queries)."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP_WORDS]


class BM25Index:
    """Okapi BM25 with the usual k1 / b; idf is the non-negative `log(1 + (N - df + 0.5) / (df + 0.5))`."""

    def __init__(self, docs: Sequence[dict[str, Any]], k1: float = 1.5, b: float = 0.75):
        if not docs:
            raise ValueError("the corpus is empty")
        self.docs = list(docs)
        self.k1, self.b = k1, b
        self.term_freqs = [Counter(tokenize(f"{d.get('title', '')} {d['text']}")) for d in self.docs]
        self.lengths = [sum(tf.values()) for tf in self.term_freqs]
        self.avg_length = sum(self.lengths) / len(self.lengths) or 1.0
        df: Counter[str] = Counter()
        for tf in self.term_freqs:
            df.update(tf.keys())
        n = len(self.docs)
        self.idf = {term: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for term, f in df.items()}

    def score(self, query_terms: list[str], i: int) -> float:
        tf, norm = self.term_freqs[i], self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_length)
        return sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in query_terms if t in tf)

    def search(self, query: str, topk: int) -> list[dict[str, Any]]:
        terms = [t for t in tokenize(query) if t in self.idf]
        if not terms or topk <= 0:
            return []
        scored = [(self.score(terms, i), i) for i in range(len(self.docs))]
        best = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:topk]
        return [
            {
                "id": self.docs[i].get("id", str(i)),
                "title": self.docs[i].get("title", ""),
                "text": self.docs[i]["text"],
                "score": round(s, 6),
                "contents": f'"{self.docs[i].get("title", "")}"\n{self.docs[i]["text"]}',
            }
            for s, i in best
        ]


def load_corpus(path: str | Path) -> list[dict[str, Any]]:
    docs = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            doc = json.loads(line)
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise ValueError(f"{path}:{n}: a corpus line must be an object with a 'text' string")
            docs.append(doc)
    return docs


def make_app(index: BM25Index) -> web.Application:
    app = web.Application()
    stats = {"requests": 0}

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "num_docs": len(index.docs), "requests": stats["requests"]})

    async def retrieve(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            queries = body["queries"]
            topk = int(body.get("topk", 3))
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                raise ValueError("'queries' must be a list of strings")
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        stats["requests"] += 1
        topk = max(0, min(topk, MAX_TOPK))
        return web.json_response({"result": [index.search(q, topk) for q in queries]})

    app.router.add_get("/health", health)
    app.router.add_post("/retrieve", retrieve)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="BM25 retrieval server for the Search-R1 example.")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default: loopback only).")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="JSONL passages: id, title, text.")
    a = p.parse_args(argv)
    index = BM25Index(load_corpus(a.corpus))
    print(f"retrieval server: {len(index.docs)} passages from {a.corpus}; http://{a.host}:{a.port}", flush=True)
    web.run_app(make_app(index), host=a.host, port=a.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
