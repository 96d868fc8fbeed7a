"""A fake SGLang server for the SGLangEngine tests: SGLang's native API shapes (each
quoted from the SGLang file it comes from, paths under python/sglang/srt/), a
deterministic "model" (`fake_completion`), and scripted misbehavior.

In a thread: `with FakeSGLang() as fake: ...` (fake.script, fake.calls). As a process
(for SIGKILL): `python -m tests.sglang.fake_server --port P --log FILE --delay S`, which
appends "start RID" / "done RID" lines to FILE. Standard library only (http.server), so
a process is up in a fraction of a second.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_completion(input_ids, sampling_params: dict, version: str):
    """The fake model: (output ids, log-probs, finish_reason) from the context and the
    weights version ("default" or a number); stops on the request's stop ids."""
    shift = 0 if version == "default" else 17 * int(version)
    ids, logprobs = [], []
    for k in range(sampling_params["max_new_tokens"]):
        token = (sum(input_ids) + 7 * k + shift) % 60 + 40
        ids.append(token)
        logprobs.append(-0.01 * (k + 1) - 0.001 * token)
        if token in (sampling_params.get("stop_token_ids") or ()):
            # schedule_batch.py FINISH_MATCHED_TOKEN.to_json:
            # {"type": "stop", "matched": self.matched}
            return ids, logprobs, {"type": "stop", "matched": token}
    # schedule_batch.py FINISH_LENGTH.to_json: {"type": "length", "length": self.length}
    return ids, logprobs, {"type": "length", "length": len(ids)}


def generate_answer(body: dict, version: str) -> dict:
    """A /generate answer as SGLang builds it: tokenizer_manager.py `_handle_batch_output`
    ({"text", "output_ids", "meta_info"}), meta_info from `BatchStrOutput` fields, and
    `output_token_logprobs` as `detokenize_logprob_tokens` leaves them without
    return_text_in_logprobs: [(logprob, token_id, None), ...]."""
    ids, logprobs, reason = fake_completion(body["input_ids"], body["sampling_params"], version)
    return {"text": "", "output_ids": ids, "meta_info": {
        "id": body["rid"], "finish_reason": reason, "prompt_tokens": len(body["input_ids"]),
        "weight_version": version, "completion_tokens": len(ids), "cached_tokens": 0,
        "e2e_latency": 0.001,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)]}}


def abort_answer(body: dict, message: str, version: str) -> dict:
    """schedule_batch.py FINISH_ABORT.to_json: {"type": "abort", "message", "status_code",
    "err_type"}, answered with HTTP 200."""
    return {"text": "", "output_ids": [], "meta_info": {
        "id": body["rid"], "finish_reason": {"type": "abort", "message": message,
                                             "status_code": None, "err_type": None},
        "prompt_tokens": len(body["input_ids"]), "completion_tokens": 0, "cached_tokens": 0,
        "weight_version": version, "output_token_logprobs": []}}


class FakeState:
    """What a fake server does and saw."""

    def __init__(self, delay_s: float = 0.0, log_path: str | None = None):
        self.delay_s, self.health_delay_s = delay_s, 0.0
        self.version = "default"  # server_args.weight_version's default
        self.script: collections.deque = collections.deque()  # per-/generate steps
        self.fail_updates = False
        self.fail_generate: int | None = None  # an HTTP status every /generate answers
        self.adapters: dict[str, str] = {}  # loaded LoRA adapters: name -> path
        self.calls: list[tuple[str, dict]] = []
        self.routing_keys: list[str | None] = []  # each /generate's X-SMG-Routing-Key
        self.in_flight = self.max_in_flight = 0
        self.log_path = log_path
        self._lock = threading.Lock()

    def log(self, event: str, rid: str) -> None:
        if self.log_path:
            with self._lock, open(self.log_path, "a") as f:
                f.write(f"{event} {rid}\n")

    def generate(self, body: dict) -> tuple[int, dict]:
        self.log("start", body["rid"])
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            step = self.script.popleft() if self.script else {}
            if self.fail_generate is not None:
                step = {"status": self.fail_generate, "message": "wedged", "delay": 0.0}
            time.sleep(step.get("delay", self.delay_s))
            if step.get("drop"):
                return None, None  # the connection closes without an answer
            if "status" in step:
                # entrypoints/http_server.py `_create_error_response`:
                # ORJSONResponse({"error": {"message": str(e)}}, status_code=...)
                return step["status"], {"error": {"message": step["message"]}}
            if "abort" in step:
                return 200, abort_answer(body, step["abort"], self.version)
            answer = generate_answer(body, self.version)
            if "edit" in step:
                step["edit"](answer)
            self.log("done", body["rid"])
            return 200, answer
        finally:
            with self._lock:
                self.in_flight -= 1

    def update_weights(self, body: dict) -> tuple[int, dict]:
        # entrypoints/http_server.py update_weights_from_disk: {"success", "message",
        # "num_paused_requests"}, HTTP 400 when not successful.
        if self.fail_updates or not os.path.isdir(body["model_path"]):
            return 400, {"success": False, "message": "Failed to load weights",
                         "num_paused_requests": 0}
        self.version = body.get("weight_version") or self.version
        return 200, {"success": True, "message": "Succeeded to update model weights.",
                     "num_paused_requests": 0}

    def post(self, path: str, body: dict, headers=None) -> tuple[int, dict | str]:
        self.calls.append((path.lstrip("/"), body))
        if path == "/generate":
            self.routing_keys.append((headers or {}).get("X-SMG-Routing-Key"))
        if path == "/generate":
            return self.generate(body)
        if path == "/update_weights_from_disk":
            return self.update_weights(body)
        if path == "/load_lora_adapter":
            # entrypoints/http_server.py load_lora_adapter: LoadLoRAAdapterReqOutput
            # {"success", "error_message", "loaded_adapters"}, HTTP 400 when it failed.
            if self.fail_updates or body["lora_name"] in self.adapters:
                return 400, {"success": False, "error_message": "Failed to load adapter",
                             "loaded_adapters": self.adapters}
            self.adapters[body["lora_name"]] = body["lora_path"]
            return 200, {"success": True, "error_message": None,
                         "loaded_adapters": self.adapters}
        if path == "/unload_lora_adapter":
            self.adapters.pop(body["lora_name"])
            return 200, {"success": True, "error_message": None,
                         "loaded_adapters": self.adapters}
        if path in ("/pause_generation", "/continue_generation"):
            return 200, "ok"  # http_server.py answers plain text
        return 404, {"detail": "Not Found"}

    def generate_bodies(self) -> list[dict]:
        return [body for endpoint, body in self.calls if endpoint == "generate"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves SGLang

    def log_message(self, *args):
        pass

    def _reply(self, status: int, answer) -> None:
        data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(answer, str)
                         else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        state: FakeState = self.server.state
        if self.path == "/health":  # http_server.py: `return Response(status_code=200)`
            time.sleep(state.health_delay_s)
            self._reply(200, "")
        elif self.path == "/model_info":  # http_server.py model_info (part of it)
            self._reply(200, {"model_path": "fake", "is_generation": True,
                              "weight_version": state.version})
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        status, answer = self.server.state.post(self.path, body, self.headers)
        if status is None:
            self.close_connection = True
        else:
            self._reply(status, answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, state: FakeState):
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = state

    def handle_error(self, request, client_address):
        if not issubclass(sys.exc_info()[0], ConnectionError):  # the client gave up on it
            super().handle_error(request, client_address)


class FakeSGLang(FakeState):
    """A fake server on a free port, served from a thread (a context manager)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._server = _Server(0, self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()


class DroppingServer:
    """Accepts TCP connections and closes them at once: every request to it fails with a
    dropped connection (and /health with it)."""

    def __init__(self):
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self._socket.accept()
                connection.recv(65536)
                connection.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._socket.close()


def start_processes(specs: list[tuple[int, str, float]],
                    flags: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """Fake server processes, one per (port, log path, delay), with extra `flags`;
    returns once each answers /health."""
    processes = []
    for port, log, delay in specs:
        with open(log + ".stderr", "w") as stderr:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.sglang.fake_server", "--port", str(port),
                 "--log", log, "--delay", str(delay), *flags], cwd=REPO,
                stdout=subprocess.DEVNULL, stderr=stderr))
    deadline = time.monotonic() + 60
    for process, (port, log, _) in zip(processes, specs):
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                for p in processes:
                    p.kill()
                    p.wait()
                with open(log + ".stderr") as stderr:
                    raise RuntimeError(f"fake SGLang process did not start: "
                                       f"{stderr.read()[-2000:]}")
            time.sleep(0.02)
    return processes


def read_log(path: str) -> dict[str, list[str]]:
    """{"start": [rids], "done": [rids]} from a process's log."""
    events: dict[str, list[str]] = {"start": [], "done": []}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                event, rid = line.split()
                events[event].append(rid)
    return events


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-generate", type=int, default=None,
                        help="an HTTP status every /generate answers (a wedged server)")
    args = parser.parse_args()
    state = FakeState(args.delay, args.log)
    state.fail_generate = args.fail_generate
    _Server(args.port, state).serve_forever()
