"""The retrieval server (scripts/serve_retrieval.py) as a subprocess, and the malformed
requests every server of this project must answer with a 4xx (used by
tests/envs/test_retrieval.py and scripts/bench/reliability.py)."""
from __future__ import annotations

import contextlib
import http.client
import json
import pathlib
import socket
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[2]
# Limits small enough to test (the 2,560-query request fits under max_queries).
SERVER_FLAGS = ["--max_queries", "4096", "--batch_size", "1000", "--max_body_mb", "1"]
VALID = b'{"queries": ["Dumont born"], "topk": 1}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(corpus_path, index_dir, flags=SERVER_FLAGS):
    """Runs the retrieval server on a free local port; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve_retrieval.py"), "--corpus",
         str(corpus_path), "--index_dir", str(index_dir), "--port", str(port), *flags],
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


DEEP = b"[" * 100_000 + b"]" * 100_000
# (what is wrong, body, content type, expected status)
MALFORMED = [
    ("not JSON", b"{not json", "application/json", 400),
    ("empty body", b"", "application/json", 400),
    ("topk 1e400", b'{"queries": ["x"], "topk": 1e400}', "application/json", 400),
    ("topk -1e400", b'{"queries": ["x"], "topk": -1e400}', "application/json", 400),
    ("topk NaN", b'{"queries": ["x"], "topk": NaN}', "application/json", 400),
    ("topk Infinity", b'{"queries": ["x"], "topk": Infinity}', "application/json", 400),
    ("a query 1e400", b'{"queries": [1e400]}', "application/json", 400),
    ("a 5000-digit number", b'{"queries": ["x"], "topk": ' + b"9" * 5000 + b"}",
     "application/json", 400),
    ("nested 100k deep", DEEP, "application/json", 400),
    ("not UTF-8", b'{"queries": ["caf\xe9"]}', "application/json", 400),
    ("huge topk", b'{"queries": ["x"], "topk": 1' + b"0" * 300 + b"}", "application/json", 422),
    ("topk 0", b'{"queries": ["x"], "topk": 0}', "application/json", 422),
    ("topk -3", b'{"queries": ["x"], "topk": -3}', "application/json", 422),
    ("topk 101", b'{"queries": ["x"], "topk": 101}', "application/json", 422),
    ("topk a string", b'{"queries": ["x"], "topk": "3"}', "application/json", 422),
    ("topk a float", b'{"queries": ["x"], "topk": 2.5}', "application/json", 422),
    ("topk true", b'{"queries": ["x"], "topk": true}', "application/json", 422),
    ("no queries", b'{"topk": 3}', "application/json", 422),
    ("queries a string", b'{"queries": "x"}', "application/json", 422),
    ("queries null", b'{"queries": null}', "application/json", 422),
    ("a query a number", b'{"queries": ["x", 3]}', "application/json", 422),
    ("a query a list", b'{"queries": [["x"]]}', "application/json", 422),
    ("return_scores a string", b'{"queries": ["x"], "return_scores": "yes"}',
     "application/json", 422),
    ("a list body", b'["x"]', "application/json", 422),
    ("a null body", b"null", "application/json", 422),
    ("a number body", b"3", "application/json", 422),
    ("too many queries", json.dumps({"queries": ["x"] * 4097}).encode(), "application/json",
     413),
    ("plain text", b'{"queries": ["x"]}', "text/plain", 415),
    ("a form", b"queries=x", "application/x-www-form-urlencoded", 415),
    ("a large plain-text body", b"x" * 500_000, "text/plain", 415),
]


def send_malformed(base_url: str) -> list[tuple[str, str | None]]:
    """Sends every MALFORMED request over one kept-alive HTTP/1.1 connection, each
    followed by a valid request on the same connection. Returns (what, problem) per
    case, problem None when the case held: the expected 4xx with a JSON message, then
    the valid request answered without the connection being dropped."""
    port = int(base_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(body, content_type):
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, response.read()

    send(VALID, "application/json")  # opens the connection
    sock, outcomes = conn.sock, []
    for what, body, content_type, status in MALFORMED:
        try:
            got, text = send(body, content_type)
            problem = None if got == status and json.loads(text)["detail"] else \
                f"HTTP {got} (want {status}): {text[:200]!r}"
            got, text = send(VALID, "application/json")
            if problem is None and (got != 200 or conn.sock is not sock):
                problem = f"the valid request after it: HTTP {got}, connection kept: " \
                          f"{conn.sock is sock}"
        except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
            problem = f"{type(error).__name__}: {error}"
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            send(VALID, "application/json")
            sock = conn.sock
        outcomes.append((what, problem))
    conn.close()
    return outcomes
