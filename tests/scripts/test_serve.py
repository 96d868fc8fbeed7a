"""scripts/serve.py as a process: prints its URL once ready, answers /health, /generate
and, to the openai client, /v1/chat/completions (the in-process engine's tokens and
log-probs for the same seed), stops on SIGTERM, and stops when the launcher named by
--parent-pid dies, even by SIGKILL."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from flax import nnx

from agentjax.models.hf import load_hf, make_tiny_hf
from agentjax.models import chat
from agentjax.models.tokenizer import build_tokenizer, load_tokenizer, stop_token_ids
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.lanes import LanedEngine
from tests.agents.fakes import CORPUS
from tests.scripts.test_train import ROOT

FLAGS = ["--port", "0", "--context-length", "128", "--max-running-requests", "2",
         "--prefill-chunks", "16", "--decode-steps", "4", "--enable-deterministic-inference",
         "--random-seed", "3"]
# The same engine built in-process, as the trainer builds its own.
ENGINE = dict(lanes=1, max_slots=2, max_len=128, prefill_chunks=(16,), decode_steps=4,
              deterministic=True, seed=3)
READY = re.compile(r"\[agentjax\] serving .* at (http://\S+)")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "model"
    make_tiny_hf(path, tokenizer=build_tokenizer(CORPUS * 4, vocab_size=384))
    return str(path)


class Output:
    """A process's output lines, read by a thread so that waiting for one can time out."""

    def __init__(self, stream):
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream],
                         daemon=True).start()

    def wait_for(self, pattern: re.Pattern, timeout_s: float = 240) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if match := pattern.search(line):
                return match
        raise AssertionError("not seen in time:\n" + "".join(self.seen))


def serve_command(model_path, *flags):
    return [sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--model-path",
            model_path, *FLAGS, *flags]


def alive(pid: int) -> bool:
    """Whether `pid` runs (an exited orphan nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_serve_answers_then_stops_on_sigterm(model_path):
    # Overlap off in the server, on in the in-process engine: the same tokens.
    proc = subprocess.Popen(serve_command(model_path, "--disable-overlap-schedule",
                                          "--served-model-name", "tiny-policy"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(proc.stdout)
    try:
        url = output.wait_for(READY).group(1)
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        info = httpx.get(url + "/get_server_info", timeout=30).json()
        assert info["disable_overlap_schedule"] is True
        answer = httpx.post(url + "/generate", timeout=60, json={
            "input_ids": [5, 6, 7], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "sampling_seed": 1}}).json()
        # The OpenAI endpoint of the same server, through the openai client over TCP.
        messages = [{"role": "user", "content": "Which city is the capital of France?"}]
        reply = openai.OpenAI(base_url=url + "/v1", api_key="unused").chat.completions.create(
            model="tiny-policy", messages=messages, seed=2, max_tokens=6, logprobs=True)
        model, _ = load_hf(model_path)
        tokenizer = load_tokenizer(model_path)
        with LanedEngine.build(*nnx.split(model), tokenizer=tokenizer, **ENGINE) as engine:
            [[want], [chat_want]] = engine.generate_sync([
                GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=6, seed=1)),
                GenerateRequest(chat.prompt_ids(tokenizer, messages), SamplingParams(
                    max_new_tokens=6, seed=2, stop_token_ids=stop_token_ids(tokenizer)))])
        assert answer["output_ids"] == want.output_ids
        assert [lp for lp, _, _ in answer["meta_info"]["output_token_logprobs"]] == \
            want.logprobs
        stopped = chat_want.finish_reason == "stop"  # the reply drops the stop token
        kept = chat_want.output_ids[:-1] if stopped else chat_want.output_ids
        assert reply.choices[0].message.content == tokenizer.decode(kept)
        assert [t.logprob for t in reply.choices[0].logprobs.content] == \
            chat_want.logprobs[:len(kept)]
        assert reply.model == "tiny-policy"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        output.wait_for(re.compile(r"engine closed"), timeout_s=10)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_serve_stops_when_its_launcher_is_killed(model_path):
    # The launcher starts the server with --parent-pid and passes its output through.
    launcher_code = (
        "import os, subprocess, sys; "
        f"p = subprocess.Popen({serve_command(model_path, '--skip-server-warmup')!r} + "
        "['--parent-pid', str(os.getpid())]); "
        "print('server pid', p.pid, flush=True); p.wait()")
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(launcher.stdout)
    server_pid = int(output.wait_for(re.compile(r"server pid (\d+)")).group(1))
    try:
        url = output.wait_for(READY).group(1)
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(server_pid), "the server outlived its launcher"
    finally:
        if alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
