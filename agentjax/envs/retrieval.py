"""Document retrieval for the search env: BM25 in-process, or a Search-R1 HTTP server.

Corpus format (Search-R1's, one JSON object per line):
    {"id": "42", "contents": "\\"Title\\"\\nBody text ..."}
The first line of `contents` is the title (kept verbatim, quotes included, exactly as
Search-R1 shows it), the rest is the text.

Both retrievers implement `Retriever.search(queries, topk) -> list[list[Document]]`.
`HttpRetriever` speaks Search-R1's `POST /retrieve`, so the env can point at an existing
Search-R1 server (e5 + FAISS over wiki-18) or at `scripts/serve_retrieval.py`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import bm25s
import httpx
import numpy as np

from agentjax.core.http_json import post_json
from agentjax.core.jsonl import read_jsonl


@dataclasses.dataclass(frozen=True)
class Document:
    """One retrieved document.

    Attributes:
      id: the corpus id.
      title: first line of `contents`, verbatim.
      text: the rest of `contents`.
      score: retrieval score (higher is better; None when the server sent none).
    """

    id: str
    title: str
    text: str
    score: float | None = None

    @property
    def contents(self) -> str:
        """The Search-R1 `contents` string this document came from."""
        return f"{self.title}\n{self.text}"

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float | None = None) -> "Document":
        title, _, text = contents.partition("\n")
        return cls(id=str(id), title=title, text=text, score=score)


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers batched queries with ranked documents."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        """Returns, per query in order, at most `topk` documents, best first."""


class RetrievalError(RuntimeError):
    """The retriever could not answer (server down, timeout, malformed response)."""


def format_docs(docs: Sequence[Document]) -> str:
    """Search-R1's observation text: one `Doc {i}(Title: {title}) {text}` line per doc."""
    return "".join(f"Doc {i}(Title: {d.title}) {d.text}\n" for i, d in enumerate(docs, 1))


def read_corpus(path_or_records: str | os.PathLike | Iterable[Mapping[str, Any]]
                ) -> list[Document]:
    """Reads a Search-R1 corpus (jsonl path or iterable of dicts) into Documents.

    Args:
      path_or_records: a `.jsonl` path, or an iterable of `{"id", "contents"}` dicts.

    Raises:
      ValueError: naming the file and line (or record index) of a bad record, a
        duplicate id, or an empty corpus.
    """
    if isinstance(path_or_records, (str, os.PathLike)):
        source = str(path_or_records)
        records = _jsonl_records(source)
    else:
        source = "records"
        records = enumerate(path_or_records)
    docs, seen = [], set()
    for where, record in records:
        at = f"{source}: line {where + 1}" if source != "records" else f"records[{where}]"
        if not isinstance(record, Mapping) or "id" not in record or "contents" not in record:
            raise ValueError(f'{at}: expected an object with "id" and "contents"')
        if not isinstance(record["contents"], str):
            raise ValueError(f'{at}: "contents" must be a string')
        doc = Document.from_contents(record["id"], record["contents"])
        if doc.id in seen:
            raise ValueError(f"{at}: duplicate id {doc.id!r}")
        seen.add(doc.id)
        docs.append(doc)
    if not docs:
        raise ValueError(f"{source}: the corpus is empty")
    return docs


def _jsonl_records(path: str):
    for index, record in read_jsonl(path):
        if isinstance(record, json.JSONDecodeError):
            raise ValueError(f"{path}: line {index + 1}: invalid JSON ({record.msg})")
        yield index, record


_INDEX_META = "agentjax_bm25.json"
_INDEX_DOCS = "documents.jsonl"


# Words of one or more characters: Lucene's analyzer (Search-R1's BM25 via Pyserini)
# keeps single letters and digits, bm25s's default pattern drops them.
_TOKEN_PATTERN = r"(?u)\b\w+\b"


class BM25Retriever:
    """Lexical retrieval with bm25s (Lucene scoring) over title + text, lowercased,
    English stopwords removed.

    Build with `from_corpus`, persist with `save`, reopen with `load`. `search` is
    read-only and safe to call from many threads.

    Args:
      documents: the corpus, in index order.
      model: a fitted `bm25s.BM25` over exactly those documents.
      stopwords: the stopword setting used to tokenize the corpus (reused for queries).
    """

    def __init__(self, documents: Sequence[Document], model: bm25s.BM25,
                 stopwords: str | None = "en"):
        self.documents = list(documents)
        self.model = model
        self.stopwords = stopwords

    @classmethod
    def from_corpus(cls, path_or_records, *, index_dir: str | os.PathLike | None = None,
                    k1: float = 0.9, b: float = 0.4, stopwords: str | None = "en"
                    ) -> "BM25Retriever":
        """Indexes a Search-R1 corpus.

        Args:
          path_or_records: corpus `.jsonl` path or iterable of `{"id", "contents"}` dicts
            (see `read_corpus` for the errors raised on bad records).
          index_dir: when given, the index is also saved there.
          k1, b: BM25 parameters (defaults are Pyserini's, which Search-R1's BM25 uses).
          stopwords: bm25s stopword list name ("en") or None.
        """
        docs = read_corpus(path_or_records)
        tokens = bm25s.tokenize([d.contents for d in docs], stopwords=stopwords,
                                token_pattern=_TOKEN_PATTERN, show_progress=False)
        model = bm25s.BM25(k1=k1, b=b)
        model.index(tokens, show_progress=False)
        retriever = cls(docs, model, stopwords)
        if index_dir is not None:
            retriever.save(index_dir)
        return retriever

    def save(self, index_dir: str | os.PathLike) -> None:
        """Writes the index and the documents to `index_dir` (created if missing)."""
        index_dir = pathlib.Path(index_dir)
        index_dir.mkdir(parents=True, exist_ok=True)
        self.model.save(str(index_dir), show_progress=False)
        with open(index_dir / _INDEX_DOCS, "w", encoding="utf-8") as f:
            for d in self.documents:
                f.write(json.dumps({"id": d.id, "contents": d.contents}) + "\n")
        (index_dir / _INDEX_META).write_text(json.dumps(
            {"format": 1, "num_documents": len(self.documents), "stopwords": self.stopwords}))

    @classmethod
    def load(cls, index_dir: str | os.PathLike) -> "BM25Retriever":
        """Reopens an index written by `save`.

        Raises:
          FileNotFoundError / ValueError: naming `index_dir` when it holds no (or an
            inconsistent) index.
        """
        index_dir = pathlib.Path(index_dir)
        meta_path = index_dir / _INDEX_META
        if not meta_path.is_file():
            raise FileNotFoundError(f"index_dir {str(index_dir)!r} holds no BM25 index "
                                    f"({_INDEX_META} missing); build one with from_corpus")
        meta = json.loads(meta_path.read_text())
        docs = read_corpus(index_dir / _INDEX_DOCS)
        model = bm25s.BM25.load(str(index_dir), show_progress=False)
        if len(docs) != meta["num_documents"] or model.scores["num_docs"] != len(docs):
            raise ValueError(f"index_dir {str(index_dir)!r}: documents and index disagree "
                             f"({len(docs)} documents, index over "
                             f"{model.scores['num_docs']})")
        return cls(docs, model, meta["stopwords"])

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        """Returns the `topk` best documents per query; documents sharing no term with
        the query (score 0) are left out, so a result may hold fewer than `topk`."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        tokens = bm25s.tokenize(list(queries), stopwords=self.stopwords,
                                token_pattern=_TOKEN_PATTERN, return_ids=False,
                                show_progress=False)
        k = min(topk, len(self.documents))
        # numpy top-k: bm25s would otherwise pick jax when installed and compile a new
        # top_k for every distinct k and batch size. n_threads=0 scores in this thread
        # (any other value starts and joins a thread pool on every call).
        indices, scores = self.model.retrieve(tokens, k=k, show_progress=False,
                                              n_threads=0, backend_selection="numpy")
        return [
            [dataclasses.replace(self.documents[i], score=float(s))
             for i, s in zip(row_idx, row_scores) if s > 0]
            for row_idx, row_scores in zip(np.asarray(indices), np.asarray(scores))
        ]


class HttpRetriever:
    """Client of a Search-R1 retrieval server (`POST /retrieve`).

    Args:
      url: the endpoint, e.g. "http://127.0.0.1:8000/retrieve" (a bare
        "http://host:port" gets "/retrieve" appended).
      timeout_s: per-request timeout (connect, read and write).
      retries: extra attempts after a failed request (connection error, timeout, HTTP 5xx
        or malformed body), with exponential backoff starting at `backoff_s`.
      backoff_s: first retry delay in seconds.
      transport: an httpx transport to send requests through (default: TCP), e.g. a
        Unix-socket transport.

    Raises `RetrievalError` when every attempt failed, at once on an HTTP status other
    than 200 and 5xx (a client error does not heal on retry), and for a response of the
    wrong shape (module `_parse_response`); the env turns it into an error observation.
    Safe to use from many threads (they share one connection pool).
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 2,
                 backoff_s: float = 0.2, transport: httpx.BaseTransport | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if httpx.URL(url).path in ("", "/"):
            url = url.rstrip("/") + "/retrieve"
        if retries < 0 or timeout_s <= 0:
            raise ValueError(f"need retries >= 0 and timeout_s > 0, got {retries}, "
                             f"{timeout_s}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        return post_json(self._client, self.url, payload,
                         parse=lambda body: _parse_response(body, len(queries), int(topk)),
                         error=RetrievalError, retries=self.retries, backoff_s=self.backoff_s)

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()


def _parse_response(body: Any, num_queries: int, topk: int) -> list[list[Document]]:
    """Reads `{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`:
    one list of at most `topk` hits per query. Also accepts bare documents (what
    Search-R1 returns when return_scores is false) and documents without an id (its BM25
    server sends `{"title", "text", "contents"}`).

    Raises:
      RetrievalError: "malformed response: ..." naming the first thing out of shape.
    """
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise RetrievalError('malformed response: expected {"result": [...]}')
    result = body["result"]
    if len(result) != num_queries:
        raise RetrievalError(f"malformed response: {len(result)} results for "
                             f"{num_queries} queries")
    out = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise RetrievalError(f"malformed response: result[{i}] is not a list of hits")
        if len(hits) > topk:
            raise RetrievalError(f"malformed response: {len(hits)} hits for topk={topk}")
        out.append([_parse_hit(hit, f"result[{i}][{j}]") for j, hit in enumerate(hits)])
    return out


def _parse_hit(hit: Any, where: str) -> Document:
    doc, score = ((hit["document"], hit.get("score"))
                  if isinstance(hit, dict) and "document" in hit else (hit, None))
    if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
        raise RetrievalError(f'malformed response: {where} is not a document with string '
                             '"contents"')
    doc_id = doc.get("id", "")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise RetrievalError(f"malformed response: {where} has an id that is not a string "
                             f"or integer")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                              or not math.isfinite(score)):
        raise RetrievalError(f"malformed response: {where} has a score that is not a "
                             f"finite number")
    return Document.from_contents(doc_id, doc["contents"],
                                  None if score is None else float(score))


class DelayedRetriever:
    """`retriever` answering each search after `latency_s` seconds, as a remote server
    (50-500 ms) would: benchmarks of rollouts against slow tools on a local index."""

    def __init__(self, retriever: Retriever, latency_s: float):
        if not latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.retriever, self.latency_s = retriever, latency_s

    def search(self, queries: Sequence[str], topk: int) -> list[list[Document]]:
        time.sleep(self.latency_s)
        return self.retriever.search(queries, topk)


def make_retriever(spec: "Retriever | str") -> Retriever:
    """A retriever from config: an object passes through; "http(s)://..." is a server
    URL (HttpRetriever); any other string is a saved BM25 index directory."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith(("http://", "https://")):
        return HttpRetriever(spec)
    return BM25Retriever.load(spec)
