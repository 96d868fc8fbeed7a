"""Retrieval: corpus reading, BM25 against a float64 reference, save/load, the HTTP
server (as a subprocess) with concurrent HttpRetriever clients, and failure handling."""
import concurrent.futures
import json
import math
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import numpy as np
import pytest

from agentjax.envs.retrieval import (BM25Retriever, Document, HttpRetriever,
                                     RetrievalError, format_docs, make_retriever,
                                     read_corpus)

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_read_corpus_splits_title_and_text(corpus_path):
    docs = read_corpus(corpus_path)
    assert docs[0] == Document("person-0", '"Alvarez"',
                               "Alvarez was born in Quellport. Alvarez works for Acme Dynamics.")
    assert docs[0].contents == json.loads(corpus_path.read_text().splitlines()[0])["contents"]
    assert read_corpus([{"id": 7, "contents": "no title line"}]) == [
        Document("7", "no title line", "")]


@pytest.mark.parametrize("lines, error", [
    (['{"id": "a", "contents": "x"}', "{not json"], r"line 2: invalid JSON"),
    (['{"id": "a"}'], r"line 1: expected an object"),
    (['{"id": "a", "contents": 3}'], r"line 1: \"contents\" must be a string"),
    (['{"id": "a", "contents": "x"}', '{"id": "a", "contents": "y"}'],
     r"line 2: duplicate id 'a'"),
    ([""], "the corpus is empty"),
])
def test_read_corpus_reports_bad_lines(tmp_path, lines, error):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=error) as info:
        read_corpus(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=r"records\[0\]"):
        read_corpus([["not", "a", "dict"]])


def reference_bm25(contents: list[str], query: list[str], k1: float, b: float) -> np.ndarray:
    """Lucene BM25 in float64, straight from the formula:
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)),
    score(q, d) = sum_t idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl))."""
    docs = [Counter(c.replace('"', " ").lower().split()) for c in contents]
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    avgdl = lengths.mean()
    n = len(docs)
    scores = np.zeros(n, dtype=np.float64)
    for term in set(query):
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        tf = np.array([d[term] for d in docs], dtype=np.float64)
        scores += idf * tf / (tf + k1 * (1 - b + b * lengths / avgdl))
    return scores


def test_bm25_matches_float64_reference():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(40)]
    contents = [f'"t{i}"\n' + " ".join(rng.choice(vocab, size=rng.integers(3, 30)))
                for i in range(60)]
    retriever = BM25Retriever.from_corpus(
        [{"id": str(i), "contents": c} for i, c in enumerate(contents)], k1=1.2, b=0.75)
    queries = [["w1", "w7"], ["w3"], ["t5", "w2", "w30"], ["w39", "w0", "w11", "w12"]]
    results = retriever.search([" ".join(q) for q in queries], topk=5)
    for query, docs in zip(queries, results):
        expected = reference_bm25(contents, query, k1=1.2, b=0.75)
        got = np.array([d.score for d in docs])
        np.testing.assert_allclose(got, np.sort(expected)[::-1][:5], rtol=1e-5)
        np.testing.assert_allclose(got, expected[[int(d.id) for d in docs]], rtol=1e-5)


def test_bm25_search_semantics(bm25):
    hits = bm25.search(["where was Castellan born", "Umberfield bridges",
                        "zyzzyva quux", "", "the of a"], topk=3)
    assert hits[0][0].id == "person-2" and hits[0][0].title == '"Castellan"'
    assert hits[1][0].id == "city-4"
    assert hits[2] == hits[3] == hits[4] == []  # no shared term: nothing, not noise
    assert all(len(h) <= 3 for h in hits)
    assert all(a.score >= b.score for h in hits for a, b in zip(h, h[1:]))
    # Single-character tokens (digits) are indexed, as Lucene does.
    assert bm25.search(["6 bridges"], topk=1)[0][0].id == "city-4"
    # topk larger than the corpus is fine; a bad topk is a clear error.
    assert len(bm25.search(["born"], topk=1000)[0]) == 10
    assert bm25.search([], topk=3) == []
    with pytest.raises(ValueError, match="topk"):
        bm25.search(["x"], topk=0)


def test_bm25_save_load_round_trip(tmp_path, corpus_path, bm25):
    built = BM25Retriever.from_corpus(corpus_path, index_dir=tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")
    queries = ["Galloway company", "Saltmarsh", "Borealis Mills workers"]
    assert loaded.search(queries, 4) == built.search(queries, 4) == bm25.search(queries, 4)
    assert make_retriever(str(tmp_path / "idx")).search(queries, 4) == loaded.search(
        queries, 4)
    with pytest.raises(FileNotFoundError, match="holds no BM25 index"):
        BM25Retriever.load(tmp_path)


def test_format_docs_is_search_r1s():
    docs = [Document("1", '"Paris"', "Paris is the capital.\nSecond line."),
            Document("2", '"Lyon"', "Lyon is a city.")]
    assert format_docs(docs) == ('Doc 1(Title: "Paris") Paris is the capital.\nSecond line.\n'
                                 'Doc 2(Title: "Lyon") Lyon is a city.\n')
    assert format_docs([]) == ""


# ---------------------------------------------------------------- HTTP

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(corpus_path, tmp_path_factory):
    port = free_port()
    index_dir = tmp_path_factory.mktemp("served-index")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve_retrieval.py"), "--corpus",
         str(corpus_path), "--index_dir", str(index_dir), "--port", str(port)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + proc.stdout.read().decode())
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def test_server_speaks_search_r1_api(server_url):
    assert httpx.get(server_url + "/health").json() == {"status": "ok", "num_documents": 15}
    body = httpx.post(server_url + "/retrieve", json={
        "queries": ["Dumont born"], "topk": 2, "return_scores": True}).json()
    first = body["result"][0][0]
    assert first["document"] == {"id": "person-3", "contents":
                                 '"Dumont"\nDumont was born in Thornbury. '
                                 'Dumont works for Acme Dynamics.'}
    assert first["score"] > 0 and len(body["result"][0]) == 2
    # Without scores Search-R1 returns bare documents; default topk is 3.
    bare = httpx.post(server_url + "/retrieve", json={"queries": ["Dumont born"]}).json()
    assert bare["result"][0][0] == first["document"] and len(bare["result"][0]) == 3
    bad = httpx.post(server_url + "/retrieve", json={"queries": ["x"], "topk": 0})
    assert bad.status_code == 422
    assert httpx.post(server_url + "/retrieve", json={"topk": 3}).status_code == 422


def test_http_retriever_matches_in_process_under_concurrency(server_url, bm25):
    client = HttpRetriever(server_url)  # "/retrieve" is appended to a bare URL
    assert client.url.endswith("/retrieve")
    queries = [f"{person} born" for person in
               ["Alvarez", "Brontë", "Castellan", "Dumont", "Eskildsen", "Fairweather",
                "Galloway", "Hargreave", "Ingleby", "Jessop"]] * 4 + ["Cobalt Freight"] * 8
    expected = bm25.search(queries, 3)

    def one(i):
        return client.search([queries[i]], 3)[0]

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, range(len(queries))))
    for docs, want in zip(got, expected):
        assert [d.id for d in docs] == [d.id for d in want]
        assert [d.contents for d in docs] == [d.contents for d in want]
        np.testing.assert_allclose([d.score for d in docs], [d.score for d in want],
                                   rtol=1e-6)
    # A batch in one request answers in order.
    batch = client.search(queries[:5], 2)
    assert [[d.id for d in h] for h in batch] == [[d.id for d in h[:2]] for h in expected[:5]]


def test_http_query_with_a_lone_surrogate_is_sent(server_url):
    # UTF-8 cannot encode it: the request body escapes it instead of failing to encode.
    docs = HttpRetriever(server_url, retries=0).search(["Dumont\ud800 born"], 1)[0]
    assert [d.id for d in docs] == ["person-3"]


def test_dead_server_raises_retrieval_error_after_retries():
    client = HttpRetriever(f"http://127.0.0.1:{free_port()}/retrieve", timeout_s=1,
                           retries=2, backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(RetrievalError, match="3 attempts failed"):
        client.search(["anything"], 3)
    assert time.monotonic() - start < 5


def test_slow_server_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []
    stop = threading.Event()

    def accept_and_ignore():  # accepts connections and never answers
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_and_ignore, daemon=True)
    thread.start()
    client = HttpRetriever(f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve",
                           timeout_s=0.3, retries=1, backoff_s=0.01)
    start = time.monotonic()
    try:
        with pytest.raises(RetrievalError, match="Timeout"):
            client.search(["anything"], 3)
        assert time.monotonic() - start < 3
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_malformed_responses_are_retrieval_errors(monkeypatch):
    client = HttpRetriever("http://127.0.0.1:9/retrieve", retries=0)
    for body in ({"oops": 1}, {"result": []}, {"result": [[{"document": {"id": "1"}}]]},
                 {"result": [[7]]}):
        response = httpx.Response(200, json=body,
                                  request=httpx.Request("POST", client.url))
        monkeypatch.setattr(httpx.Client, "post", lambda self, *a, r=response, **k: r)
        with pytest.raises(RetrievalError, match="malformed response"):
            client.search(["q"], 3)
    with pytest.raises(ValueError, match="url"):
        HttpRetriever("localhost:8000")
