"""Retrieval: corpus reading, BM25 against a float64 reference, save/load, the HTTP
server (as a subprocess) with concurrent HttpRetriever clients, and failure handling."""
import concurrent.futures
import http.client
import json
import math
import socket
import threading
import time
from collections import Counter

import httpx
import numpy as np
import pytest

from agentjax.core.task import Task
from agentjax.envs.retrieval import (BM25Retriever, DelayedRetriever, Document,
                                     HttpRetriever, RetrievalError, format_docs,
                                     make_retriever, read_corpus)
from agentjax.envs.search.env import SearchEnv

from tests.envs.retrieval_server import VALID, free_port, send_malformed, serve


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


def test_a_delayed_retriever_answers_the_same_after_its_latency(bm25):
    delayed = DelayedRetriever(bm25, latency_s=0.05)
    start = time.perf_counter()
    hits = delayed.search(["where was Castellan born"], topk=3)
    assert time.perf_counter() - start >= 0.05
    assert hits == bm25.search(["where was Castellan born"], topk=3)
    with pytest.raises(ValueError, match="latency_s"):
        DelayedRetriever(bm25, latency_s=-1.0)


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

@pytest.fixture(scope="module")
def server_url(corpus_path, tmp_path_factory):
    with serve(corpus_path, tmp_path_factory.mktemp("served-index")) as base:
        yield base


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


def test_server_answers_search_r1s_grpo_batch_in_one_request(server_url, bm25):
    """Search-R1's client sends every search of a step in one request (GRPO recipe: 512
    prompts x 5 = 2,560); the server answers them in batches, in order."""
    queries = [f"{name} born" for name in ("Alvarez", "Dumont", "Jessop", "zyzzyva")] * 640
    body = httpx.post(server_url + "/retrieve", timeout=120, json={
        "queries": queries, "topk": 3, "return_scores": True}).json()
    assert len(body["result"]) == 2560
    expected = bm25.search(queries[:4], 3)
    for i, hits in enumerate(body["result"]):
        assert [h["document"]["id"] for h in hits] == [d.id for d in expected[i % 4]]
    # An empty batch is answered empty, as Search-R1's server does.
    assert httpx.post(server_url + "/retrieve", json={"queries": []}).json() == {"result": []}


def test_every_malformed_request_gets_a_4xx_and_the_connection_lives_on(server_url):
    """Raw bytes over one kept-alive HTTP/1.1 connection: each malformed request gets
    its 4xx and a JSON message, and a valid request right after it on the same
    connection is answered."""
    assert [(what, problem) for what, problem in send_malformed(server_url) if problem] == []
    port = int(server_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(body, content_type="application/json", method="POST", path="/retrieve"):
        conn.request(method, path, body=body,
                     headers={"Content-Type": content_type} if content_type else {})
        response = conn.getresponse()
        return response.status, response.read()

    valid = VALID
    assert send(valid)[0] == 200
    sock = conn.sock
    # No content type (curl --data-binary): read as JSON. GET is not the API.
    assert send(valid, content_type=None)[0] == 200
    assert send(None, method="GET")[0] == 405
    # A chunked body (no Content-Length) is read like any other.
    conn.putrequest("POST", "/retrieve")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (valid[:10], valid[10:]):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["result"]
    assert conn.sock is sock
    conn.close()
    # A body past --max_body_mb is refused before it is read whole; the server then
    # closes that connection, and answers the next one.
    too_large = httpx.post(server_url + "/retrieve", content=b" " * (2 << 20),
                           headers={"Content-Type": "application/json"})
    assert too_large.status_code == 413 and "max_body_mb" in too_large.json()["detail"]
    assert httpx.post(server_url + "/retrieve", content=valid).status_code == 200


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


def _respond(status=200, content=None, **kwargs):
    """A MockTransport handler answering every request alike."""
    return lambda request: httpx.Response(status, content=content, **kwargs)


def _raise(error):
    def handler(request):
        raise error("boom", request=request)
    return handler


GOOD_HIT = {"document": {"id": "1", "contents": '"T"\nbody'}, "score": 1.5}
# What a broken or hostile server can send back: (what, MockTransport handler, error).
BAD_SERVERS = [
    ("HTTP 500", _respond(500, b"Internal Server Error"), "3 attempts failed; last: HTTP 500"),
    ("HTTP 404", _respond(404, b"no such route"), "HTTP 404: no such route"),
    ("a redirect", _respond(307, headers={"location": "/elsewhere"}), "HTTP 307"),
    ("connection refused", _raise(httpx.ConnectError), "ConnectError: boom"),
    ("a read timeout", _raise(httpx.ReadTimeout), "ReadTimeout: boom"),
    ("HTML", _respond(200, b"<html>busy</html>"), "not JSON"),
    ("not UTF-8", _respond(200, b'{"result": [["\xff"]]}'), "not JSON"),
    ("nested 100k deep", _respond(200, b"[" * 100_000 + b"]" * 100_000), "not JSON"),
    ("no result", _respond(200, json={"oops": 1}), 'expected {"result"'),
    ("result a string", _respond(200, json={"result": "x"}), 'expected {"result"'),
    ("too few results", _respond(200, json={"result": []}), "0 results for 1 queries"),
    ("hits a dict", _respond(200, json={"result": [GOOD_HIT]}), "result[0] is not a list"),
    ("hits a string", _respond(200, json={"result": ["contents"]}), "not a list of hits"),
    ("a hit a number", _respond(200, json={"result": [[7]]}), "result[0][0] is not a doc"),
    ("no contents", _respond(200, json={"result": [[{"document": {"id": "1"}}]]}),
     'string "contents"'),
    ("contents a number", _respond(200, json={"result": [[{"contents": 3}]]}),
     'string "contents"'),
    ("an id a list", _respond(200, json={"result": [[{"id": [1], "contents": "x"}]]}),
     "id that is not"),
    ("a score a string", _respond(200, json={"result": [[{**GOOD_HIT, "score": "high"}]]}),
     "score that is not"),
    ("a score NaN", _respond(200, content=b'{"result": [[{"document": {"contents": "x"}, '
                                          b'"score": NaN}]]}'), "score that is not"),
    ("more hits than topk", _respond(200, json={"result": [[GOOD_HIT] * 4]}),
     "4 hits for topk=3"),
]


@pytest.mark.parametrize("what, handler, error", BAD_SERVERS, ids=[c[0] for c in BAD_SERVERS])
def test_a_bad_server_is_a_retrieval_error_and_an_error_observation(what, handler, error):
    calls = []

    def counted(request):
        calls.append(request)
        return handler(request)

    client = HttpRetriever("http://search.test/retrieve", retries=2, backoff_s=0.001,
                           transport=httpx.MockTransport(counted))
    with pytest.raises(RetrievalError, match="search.test") as info:
        client.search(["q"], 3)
    assert error in str(info.value)
    # A client error is final; anything else is retried.
    assert len(calls) == (1 if what in ("HTTP 404", "a redirect") else 3)
    # Through the env: an error observation, and the episode goes on.
    env = SearchEnv(client, max_turns=3)
    env.reset(Task("t", "q?", ("a",)))
    observation, done, _, info = env.step("<search> q </search>")
    assert not done and "Search failed" in observation and error in info["error"]
    assert env.step("<answer> a </answer>").done


def test_good_responses_parse_with_or_without_scores_and_ids():
    bare = {"result": [[{"title": "T", "text": "body", "contents": '"T"\nbody'}], []]}
    client = HttpRetriever("http://search.test/retrieve",
                           transport=httpx.MockTransport(_respond(200, json=bare)))
    assert client.search(["q1", "q2"], 3) == [[Document("", '"T"', "body")], []]
    replies = iter([httpx.Response(503), httpx.Response(200, json={"result": [[GOOD_HIT]]})])
    client = HttpRetriever("http://search.test/retrieve", backoff_s=0.001,
                           transport=httpx.MockTransport(lambda request: next(replies)))
    assert client.search(["q"], 3) == [[Document("1", '"T"', "body", 1.5)]]  # retried
    with pytest.raises(ValueError, match="url"):
        HttpRetriever("localhost:8000")
