"""A fake SGLang server for the SGLangEngine tests: SGLang's native API shapes (each
quoted from the SGLang file it comes from, paths under python/sglang/srt/), a
deterministic "model" (`fake_completion`), and scripted misbehavior.

In a thread: `with FakeSGLang() as fake: ...` (fake.script, fake.calls). As a process
(for SIGKILL): `python -m tests.rollout.sglang_fake --port P --log FILE --delay S`, which
appends "start RID" / "done RID" lines to FILE. Imports nothing of agentjax (no JAX), so
the process starts fast.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

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


def make_app(state: "FakeState") -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        # entrypoints/http_server.py: `return Response(status_code=200)`
        if state.health_delay_s:
            await asyncio.sleep(state.health_delay_s)
        return Response(status_code=200)

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        state.record("generate", body)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await answer(body, state.script.popleft() if state.script else {})
        finally:
            state.in_flight -= 1

    async def answer(body: dict, step: dict):
        await asyncio.sleep(step.get("delay", state.delay_s))
        if "status" in step:
            # entrypoints/http_server.py `_create_error_response`:
            # ORJSONResponse({"error": {"message": str(e)}}, status_code=...)
            return JSONResponse({"error": {"message": step["message"]}},
                                status_code=step["status"])
        if "abort" in step:
            # schedule_batch.py FINISH_ABORT.to_json: {"type": "abort", "message": ...,
            # "status_code": ..., "err_type": ...}
            return {"text": "", "output_ids": [], "meta_info": {
                "id": body["rid"], "finish_reason": {"type": "abort", "message": step["abort"],
                                                     "status_code": None, "err_type": None},
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": 0,
                "cached_tokens": 0, "weight_version": state.version,
                "output_token_logprobs": []}}
        answer = generate_answer(body, state.version)
        if "edit" in step:
            step["edit"](answer)
        state.log("done", body["rid"])
        return answer

    @app.post("/pause_generation")
    async def pause(request: Request):
        state.record("pause_generation", await request.json())
        return Response(content="Generation paused.", status_code=200)

    @app.post("/continue_generation")
    async def resume(request: Request):
        state.record("continue_generation", await request.json())
        return Response(content="Generation continued.", status_code=200)

    @app.post("/update_weights_from_disk")
    async def update(request: Request):
        body = await request.json()
        state.record("update_weights_from_disk", body)
        # entrypoints/http_server.py update_weights_from_disk: {"success", "message",
        # "num_paused_requests"}, HTTP 400 when not successful.
        if state.fail_updates or not os.path.isdir(body["model_path"]):
            return JSONResponse({"success": False, "message": "Failed to load weights",
                                 "num_paused_requests": 0}, status_code=400)
        state.version = body.get("weight_version") or state.version
        return {"success": True, "message": "Succeeded to update model weights.",
                "num_paused_requests": 0}

    return app


class FakeState:
    """What a fake server does and saw."""

    def __init__(self, delay_s: float = 0.0, log_path: str | None = None):
        self.delay_s, self.health_delay_s = delay_s, 0.0
        self.version = "default"  # server_args.weight_version's default
        self.script: collections.deque = collections.deque()  # per-/generate steps
        self.fail_updates = False
        self.calls: list[tuple[str, dict]] = []
        self.in_flight = self.max_in_flight = 0
        self.log_path = log_path

    def record(self, endpoint: str, body: dict) -> None:
        self.calls.append((endpoint, body))
        if endpoint == "generate":
            self.log("start", body["rid"])

    def log(self, event: str, rid: str) -> None:
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(f"{event} {rid}\n")

    def generate_bodies(self) -> list[dict]:
        return [body for endpoint, body in self.calls if endpoint == "generate"]


class FakeSGLang(FakeState):
    """A fake server on a free port, run by uvicorn in a thread (a context manager)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(
            make_app(self), host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake SGLang server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(10)


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


def start_process(port: int, log_path: str, delay_s: float) -> subprocess.Popen:
    """A fake server process on `port`; returns once /health answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.rollout.sglang_fake", "--port", str(port), "--log",
         log_path, "--delay", str(delay_s)], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"fake SGLang process did not start: "
                               f"{process.communicate()[1].decode()[-2000:]}")
        time.sleep(0.05)


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
    args = parser.parse_args()
    uvicorn.run(make_app(FakeState(args.delay, args.log)), host="127.0.0.1", port=args.port,
                log_level="warning")
