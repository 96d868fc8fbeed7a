"""Serve a BM25 index over Search-R1's retrieval API.

    python scripts/serve_retrieval.py --index_dir /data/bm25            # a saved index
    python scripts/serve_retrieval.py --corpus corpus.jsonl [--index_dir out]  # build it

Endpoints:
  POST /retrieve  {"queries": [...], "topk": k, "return_scores": bool}
                  -> {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}
                     (bare documents when return_scores is false, as Search-R1 does)
  GET  /health    -> {"status": "ok", "num_documents": N}

Point `HttpRetriever("http://HOST:PORT/retrieve")` (or SearchEnv's `retriever=` config)
at it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import fastapi
import pydantic
import uvicorn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentjax.envs.retrieval import BM25Retriever, Retriever  # noqa: E402

MAX_TOPK = 100
MAX_QUERIES = 1024


class RetrieveRequest(pydantic.BaseModel):
    queries: list[str] = pydantic.Field(max_length=MAX_QUERIES)
    topk: int | None = pydantic.Field(default=None, ge=1, le=MAX_TOPK)
    return_scores: bool = False


def create_app(retriever: Retriever, *, default_topk: int = 3,
               num_documents: int | None = None) -> fastapi.FastAPI:
    """The FastAPI app serving `retriever`.

    Args:
      retriever: answers the queries.
      default_topk: used when a request carries no `topk`.
      num_documents: reported by /health (None when unknown).
    """
    app = fastapi.FastAPI(title="agentjax retrieval")

    @app.get("/health")
    def health():
        return {"status": "ok", "num_documents": num_documents}

    # A plain `def`: FastAPI runs it in its thread pool, so concurrent requests overlap.
    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest):
        results = retriever.search(request.queries, request.topk or default_topk)
        return {"result": [
            [_hit(doc, request.return_scores) for doc in docs] for docs in results]}

    return app


def _hit(doc, return_scores: bool) -> dict:
    document = {"id": doc.id, "contents": doc.contents}
    return {"document": document, "score": doc.score} if return_scores else document


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index_dir", help="saved BM25 index (or where to save a built one)")
    parser.add_argument("--corpus", help="Search-R1 corpus .jsonl to index")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="default topk")
    args = parser.parse_args(argv)
    if args.corpus:
        retriever = BM25Retriever.from_corpus(args.corpus, index_dir=args.index_dir)
    elif args.index_dir:
        retriever = BM25Retriever.load(args.index_dir)
    else:
        parser.error("give --index_dir (a saved index) or --corpus (a jsonl to index)")
    logging.basicConfig(level=logging.INFO)
    logging.info("serving %d documents on http://%s:%d/retrieve", len(retriever.documents),
                 args.host, args.port)
    app = create_app(retriever, default_topk=args.topk,
                     num_documents=len(retriever.documents))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
