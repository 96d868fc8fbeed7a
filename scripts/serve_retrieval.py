"""Serve a BM25 index over Search-R1's retrieval API.

    python scripts/serve_retrieval.py --index_dir /data/bm25            # a saved index
    python scripts/serve_retrieval.py --corpus corpus.jsonl [--index_dir out]  # build it

Endpoints:
  POST /retrieve  {"queries": [...], "topk": k, "return_scores": bool}
                  -> {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}
                     (bare documents when return_scores is false, as Search-R1 does)
  GET  /health    -> {"status": "ok", "num_documents": N}

A request is answered in batches of `--batch_size` queries, however many it carries
(Search-R1's client sends every search of a rollout step in one request: 2,560 in its
GRPO recipe), up to `--max_queries`. An empty `queries` list is answered with an empty
`result`, as Search-R1's server does (its client sends one when no episode searched).
Every malformed request gets a 4xx status and a JSON `{"detail": message}`, and the
connection stays usable: 400 for a body that is not JSON (or has a non-finite number),
413 for too many queries or too large a body, 415 for a non-JSON content type, 422 for
JSON of the wrong shape or a `topk` out of [1, --max_topk].

Point `HttpRetriever("http://HOST:PORT/retrieve")` (or SearchEnv's `retriever=` config)
at it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
from typing import Any

import fastapi
import pydantic
import uvicorn
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from agentjax.envs.retrieval import BM25Retriever, Retriever

logger = logging.getLogger("serve_retrieval")


class RetrieveRequest(pydantic.BaseModel):
    """Search-R1's request body. Strict types: a `topk` of "3" or 3.5 is a client bug to
    report, not to guess at."""

    model_config = pydantic.ConfigDict(strict=True)

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class BadRequest(Exception):
    """A malformed request: answered with `status` and `{"detail": message}`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_request(body: bytes, *, max_queries: int, max_topk: int) -> RetrieveRequest:
    """The request in `body`, checked against the server's limits.

    Raises:
      BadRequest: with the status and message to answer (module docstring).
    """
    try:
        data = json.loads(body, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise BadRequest(400, f"the body is not valid JSON: {str(error)[:200]}") from None
    try:
        request = RetrieveRequest.model_validate(data)
    except pydantic.ValidationError as error:
        # Without the offending input: it may be huge, and it is the client's own.
        problems = [f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                    for e in error.errors(include_url=False, include_context=False,
                                          include_input=False)[:5]]
        raise BadRequest(422, "expected {\"queries\": [str, ...], \"topk\": int | null, "
                              "\"return_scores\": bool}; " + "; ".join(problems)) from None
    if len(request.queries) > max_queries:
        raise BadRequest(413, f"{len(request.queries)} queries in one request; this server "
                              f"answers at most {max_queries} (--max_queries)")
    if request.topk is not None and not 1 <= request.topk <= max_topk:
        raise BadRequest(422, f"topk must be in [1, {max_topk}] (--max_topk), got "
                              f"{str(request.topk)[:40]}")
    return request


async def read_body(request: fastapi.Request, max_bytes: int) -> bytes:
    """The request body, refused (413) past `max_bytes` before it is all in memory."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BadRequest(413, f"the body has {declared} bytes; this server takes at most "
                              f"{max_bytes} (--max_body_mb)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise BadRequest(413, f"the body exceeds {max_bytes} bytes (--max_body_mb)")
    return bytes(body)


def _is_json(content_type: str | None) -> bool:
    if content_type is None:  # curl --data-binary, raw clients: parse it as JSON
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                          and media.endswith("+json"))


def search_in_batches(retriever: Retriever, queries: list[str], topk: int,
                      batch_size: int) -> list:
    """`retriever.search` over `queries`, `batch_size` at a time, results in order."""
    results = []
    for start in range(0, len(queries), batch_size):
        results += retriever.search(queries[start:start + batch_size], topk)
    return results


def create_app(retriever: Retriever, *, default_topk: int = 3,
               num_documents: int | None = None, max_queries: int = 16384,
               max_topk: int = 100, batch_size: int = 512,
               max_body_bytes: int = 64 << 20) -> fastapi.FastAPI:
    """The FastAPI app serving `retriever`.

    Args:
      retriever: answers the queries.
      default_topk: used when a request carries no `topk`.
      num_documents: reported by /health (None when unknown).
      max_queries: most queries one request may carry (413 beyond).
      max_topk: largest `topk` a request may ask for (422 beyond).
      batch_size: queries handed to the retriever at a time.
      max_body_bytes: largest request body (413 beyond).
    """
    if min(max_queries, max_topk, batch_size, max_body_bytes, default_topk) < 1:
        raise ValueError("max_queries, max_topk, batch_size, max_body_bytes and default_topk "
                         "must be >= 1")
    if default_topk > max_topk:
        raise ValueError(f"default_topk={default_topk} exceeds max_topk={max_topk}")
    app = fastapi.FastAPI(title="agentjax retrieval")

    @app.get("/health")
    def health():
        return {"status": "ok", "num_documents": num_documents}

    @app.post("/retrieve")
    async def retrieve(request: fastapi.Request):
        try:
            if not _is_json(request.headers.get("content-type")):
                raise BadRequest(415, "send the body as application/json, got "
                                      f"{request.headers['content-type'][:100]!r}")
            parsed = parse_request(await read_body(request, max_body_bytes),
                                   max_queries=max_queries, max_topk=max_topk)
        except BadRequest as error:
            return JSONResponse({"detail": str(error)}, status_code=error.status)
        topk = parsed.topk or default_topk
        try:
            # In the thread pool: concurrent requests overlap, the event loop stays free.
            results = await run_in_threadpool(search_in_batches, retriever,
                                              parsed.queries, topk, batch_size)
            return JSONResponse({"result": [[_hit(doc, parsed.return_scores) for doc in docs]
                                            for docs in results]})
        except Exception as error:  # a retriever bug: a 500 that says so, not a reset
            logger.exception("retrieval failed")
            return JSONResponse({"detail": f"retrieval failed: {type(error).__name__}: "
                                           f"{str(error)[:200]}"}, status_code=500)

    return app


def _hit(doc, return_scores: bool) -> dict[str, Any]:
    document = {"id": doc.id, "contents": doc.contents}
    return {"document": document, "score": doc.score} if return_scores else document


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index_dir", help="saved BM25 index (or where to save a built one)")
    parser.add_argument("--corpus", help="Search-R1 corpus .jsonl to index")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="default topk")
    parser.add_argument("--max_topk", type=int, default=100,
                        help="largest topk a request may ask for")
    parser.add_argument("--max_queries", type=int, default=16384,
                        help="most queries in one request (Search-R1's GRPO recipe: 2560)")
    parser.add_argument("--batch_size", type=int, default=512,
                        help="queries handed to the retriever at a time")
    parser.add_argument("--max_body_mb", type=float, default=64.0,
                        help="largest request body in MiB")
    args = parser.parse_args(argv)
    if args.corpus:
        retriever = BM25Retriever.from_corpus(args.corpus, index_dir=args.index_dir)
    elif args.index_dir:
        retriever = BM25Retriever.load(args.index_dir)
    else:
        parser.error("give --index_dir (a saved index) or --corpus (a jsonl to index)")
    try:
        app = create_app(retriever, default_topk=args.topk,
                         num_documents=len(retriever.documents),
                         max_queries=args.max_queries, max_topk=args.max_topk,
                         batch_size=args.batch_size,
                         max_body_bytes=int(args.max_body_mb * (1 << 20)))
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO)
    logging.info("serving %d documents on http://%s:%d/retrieve", len(retriever.documents),
                 args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
