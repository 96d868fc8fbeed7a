"""Serve a policy (a local HF folder) with agentjax's engine over SGLang's native HTTP API.

    python scripts/serve.py --model-path runs/grpo_search/hf --port 30000 [--lanes 2]
    python -m agentjax.sglang.server.main ...      # the same, wherever agentjax is installed

Endpoints, request and response shapes: `agentjax/sglang/server/app.py` (SGLang's
/generate, /health, /update_weights_from_disk, /pause_generation, ...). Flags follow
`python -m sglang.launch_server` where they mean the same thing (--model-path,
--tokenizer-path, --host, --port, --context-length, --max-running-requests, --random-seed,
--dtype, --enable-deterministic-inference, --weight-version, --skip-server-warmup,
--log-level, --served-model-name, --tool-call-parser); the others set the JaxEngine
(--lanes, --decode-steps, --prefill-chunks). The same server answers OpenAI's
/v1/chat/completions and /v1/models (agentjax/endpoint/app.py), so a trained policy is
evaluated with any OpenAI client: `openai.OpenAI(base_url="http://HOST:PORT/v1")`.
LoRA as SGLang serves it: `--enable-lora --max-lora-rank R --lora-target-modules q_proj
... | all` accepts /load_lora_adapter of PEFT folders within those limits
(`adapter_loader`: merged into the served weights in float32, cast once).
`--dtype auto` is the checkpoint's own dtype (SGLang's auto serves float32 checkpoints
in float16, which CPUs do not compute natively).

When it accepts requests it prints one line on stdout:
`[agentjax] serving <model path> at http://HOST:PORT` (`--port 0` takes a free port:
read it from that line).

Stopping: SIGTERM or SIGINT closes the listening socket, gives requests in flight
--shutdown-timeout seconds, then closes the engine and exits (a second SIGINT exits at
once). `--parent-pid PID` (PID = the launcher's own pid) also stops the server when PID
is no longer its parent: the launcher died, even by SIGKILL, and the kernel reparented
the orphan. Checked once a second with getppid(), which works however the launcher dies
and whatever thread started the server. The alternatives fall short: PR_SET_PDEATHSIG
(what SGLang's own subprocesses use) fires when the *thread* that forked the child exits,
so a trainer starting servers from a worker thread would see them killed early, and it
is Linux-only; watching stdin for EOF takes the child's stdin and stays open while any
other child holds a copy of the pipe. The launcher must start this script directly, not
through a shell (the shell would be the parent).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time

import jax.numpy as jnp
import uvicorn
from flax import nnx

from agentjax.config.rules import chunk_widths
from agentjax.core import compiles
from agentjax.models.hf import load_hf
from agentjax.models.lora import TARGETS, add_adapters, fold_adapters
from agentjax.models.peft import load_peft, read_peft_config
from agentjax.models.tokenizer import load_tokenizer
from agentjax.engine.jax.lanes import LanedEngine
from agentjax.sglang.server.app import build_app, hf_params_loader

DTYPES = {"float32": jnp.float32, "float": jnp.float32, "bfloat16": jnp.bfloat16,
          "float16": jnp.float16, "half": jnp.float16}
PARENT_POLL_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, printing the ready line and marking the app as shutting down
    (so /health answers 503) as soon as a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, service, model_path: str):
        super().__init__(config)
        self.service, self.model_path = service, model_path

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            port = self.servers[0].sockets[0].getsockname()[1]
            self.service.server_args["port"] = port  # the one taken, with --port 0
            host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
            print(f"[agentjax] serving {self.model_path} at http://{host}:{port}", flush=True)

    def handle_exit(self, sig, frame) -> None:
        self.service.shutting_down = True
        super().handle_exit(sig, frame)


def watch_parent(parent_pid: int, grace_s: float) -> None:
    """Sends this process SIGTERM once `parent_pid` is no longer its parent, and ends it
    `grace_s` later if the graceful stop has not (module docstring)."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        logging.warning("parent process %d is gone: shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def checkpoint_dtype(model_path: str) -> str:
    """The dtype name config.json records (transformers 4: torch_dtype, 5: dtype)."""
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    name = config.get("torch_dtype") or config.get("dtype") or "float32"
    return name if name in DTYPES else "float32"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True, help="local HF folder to serve")
    parser.add_argument("--tokenizer-path", help="tokenizer folder (default: --model-path)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0: any free port")
    parser.add_argument("--context-length", type=int,
                        help="longest input + output (default: the model's "
                             "max_position_embeddings): a cap per request, the KV "
                             "pool is --max-total-tokens")
    parser.add_argument("--max-running-requests", type=int, default=16,
                        help="sequences decoded together")
    parser.add_argument("--page-size", type=int, default=64,
                        help="token slots per KV page")
    parser.add_argument("--max-total-tokens", type=int,
                        help="KV slots of the page pool over all lanes (default: "
                             "max-running-requests x context length)")
    parser.add_argument("--random-seed", type=int, default=0,
                        help="seed of the stream for requests without sampling_seed")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="weights and compute dtype (auto: the checkpoint's)")
    parser.add_argument("--lanes", type=int, default=1,
                        help="JaxEngines sharing the rows, one scheduler thread each")
    parser.add_argument("--decode-steps", type=int, default=8,
                        help="tokens per decode program call")
    parser.add_argument("--prefill-chunks", default="16,64,256", type=chunk_widths,
                        help="comma-separated prefill chunk widths")
    parser.add_argument("--enable-deterministic-inference", action="store_true",
                        help="batch-invariant engine: a seeded request's output does not "
                             "depend on what else runs")
    parser.add_argument("--deterministic-prefill-rows", type=int, default=4,
                        help="rows of every prefill call with "
                             "--enable-deterministic-inference")
    parser.add_argument("--disable-overlap-schedule", action="store_true",
                        help="read each decode call before dispatching the next (the "
                             "engine's overlap off)")
    parser.add_argument("--served-model-name",
                        help="the model id of /v1/chat/completions (default: --model-path)")
    parser.add_argument("--tool-call-parser", default="auto",
                        help="tool-call format of /v1/chat/completions replies, a name of "
                             "agentjax.parsers.tool_calls.TOOL_PARSERS (auto: read from the "
                             "chat template)")
    parser.add_argument("--weight-version", default="default",
                        help="weight version reported until an update sets another")
    parser.add_argument("--skip-server-warmup", action="store_true",
                        help="compile the engine's programs on first use, not at startup")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="seconds requests in flight get after SIGTERM / SIGINT")
    parser.add_argument("--parent-pid", type=int,
                        help="exit when this process (the launcher) is no longer the parent")
    parser.add_argument("--enable-lora", action="store_true",
                        help="accept /load_lora_adapter (PEFT folders) and lora_path")
    parser.add_argument("--max-lora-rank", type=int, default=64,
                        help="the largest adapter rank /load_lora_adapter accepts")
    parser.add_argument("--lora-target-modules", nargs="+", default=["all"],
                        help="projections adapters may target (q_proj ... down_proj, or all)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a TCP port")
    if args.lanes < 1 or args.max_running_requests < 1 or \
            args.max_running_requests % args.lanes:
        parser.error(f"--max-running-requests {args.max_running_requests} must be a positive "
                     f"multiple of --lanes {args.lanes}")
    if args.decode_steps < 1 or args.shutdown_timeout < 0 or args.page_size < 1:
        parser.error("--decode-steps and --page-size must be >= 1 and --shutdown-timeout "
                     ">= 0")
    if args.max_total_tokens is not None and args.max_total_tokens < 1:
        parser.error("--max-total-tokens must be >= 1")
    if args.deterministic_prefill_rows < 1:
        parser.error("--deterministic-prefill-rows must be >= 1")
    if args.parent_pid is not None and args.parent_pid != os.getppid():
        parser.error(f"--parent-pid {args.parent_pid} is not this process's parent "
                     f"({os.getppid()})")
    projections = set(TARGETS.values())
    if args.lora_target_modules != ["all"] and not set(args.lora_target_modules) <= projections:
        parser.error(f"--lora-target-modules {args.lora_target_modules}: choose among "
                     f"{sorted(projections)} or all")
    if not os.path.isfile(os.path.join(args.model_path, "config.json")):
        parser.error(f"--model-path {args.model_path}: no config.json there")
    return args


def kv_pages_per_lane(args, context_length: int) -> int:
    """Pages of each lane's pool: --max-total-tokens split over the lanes, at least one
    sequence of the context length."""
    per_sequence = -(-context_length // args.page_size)
    if args.max_total_tokens is None:
        return args.max_running_requests // args.lanes * per_sequence
    return max(-(-args.max_total_tokens // (args.page_size * args.lanes)), per_sequence)


def engine_settings(args, context_length: int) -> dict:
    """LanedEngine.build's settings from the flags (the tokenizer aside)."""
    return dict(lanes=args.lanes, max_slots=args.max_running_requests, max_len=context_length,
                prefill_chunks=args.prefill_chunks, decode_steps=args.decode_steps,
                page_size=args.page_size, kv_pages=kv_pages_per_lane(args, context_length),
                deterministic=args.enable_deterministic_inference,
                deterministic_prefill_rows=args.deterministic_prefill_rows,
                seed=args.random_seed, overlap=not args.disable_overlap_schedule)


def adapter_loader(dtype, *, max_rank: int, target_modules: list[str]):
    """`load_adapter` for build_app: (PEFT folder, base HF folder) -> the base's params
    with the adapter merged in (W + (alpha/r) A B in float32, cast once to `dtype`).
    An adapter beyond the launch limits is a ValueError naming them."""
    allowed = set(TARGETS.values()) if target_modules == ["all"] else set(target_modules)

    def load(folder: str, base_path: str):
        lora, _ = read_peft_config(folder)
        if lora.rank > max_rank:
            raise ValueError(f"{folder}: rank {lora.rank} exceeds --max-lora-rank {max_rank}")
        if not set(lora.projections) <= allowed:
            raise ValueError(f"{folder}: targets {list(lora.projections)} are not all among "
                             f"--lora-target-modules {sorted(allowed)}")
        base, _ = load_hf(base_path, dtype=dtype)
        adapted = load_peft(add_adapters(base, lora, seed=0), folder)
        return nnx.split(fold_adapters(adapted))[1]
    return load


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[agentjax] %(message)s")
    if args.parent_pid is not None:
        watch_parent(args.parent_pid, grace_s=args.shutdown_timeout + 30)
    dtype_name = checkpoint_dtype(args.model_path) if args.dtype == "auto" else args.dtype
    dtype = DTYPES[dtype_name]
    tokenizer_path = args.tokenizer_path or args.model_path
    try:
        model, config = load_hf(args.model_path, dtype=dtype)
        tokenizer = load_tokenizer(tokenizer_path)
    except (OSError, ValueError) as error:
        sys.exit(f"error: cannot load the model: {error}")
    context_length = args.context_length or config.max_position_embeddings
    if not 2 <= context_length <= config.max_position_embeddings:
        sys.exit(f"error: --context-length {context_length} must be in [2, "
                 f"{config.max_position_embeddings}] (the model's max_position_embeddings)")
    started, before = time.perf_counter(), compiles.counts()
    engine = LanedEngine.build(*nnx.split(model), tokenizer=tokenizer,
                               **engine_settings(args, context_length))
    if not args.skip_server_warmup:
        engine.warmup()
        logging.info("compiled %s in %.1fs", compiles.summary(compiles.since(before)),
                     time.perf_counter() - started)
    server_args = {name: value for name, value in vars(args).items()
                   if name not in ("prefill_chunks", "parent_pid")}
    server_args.update(tokenizer_path=tokenizer_path, dtype=dtype_name,
                       prefill_chunks=list(args.prefill_chunks))
    app = build_app(engine, tokenizer=tokenizer, model_path=args.model_path,
                    context_length=context_length, vocab_size=config.vocab_size,
                    load_params=hf_params_loader(dtype), weight_version=args.weight_version,
                    server_args=server_args, served_model_name=args.served_model_name,
                    tool_call_parser=args.tool_call_parser,
                    load_adapter=adapter_loader(dtype, max_rank=args.max_lora_rank,
                                                target_modules=args.lora_target_modules)
                    if args.enable_lora else None)

    @contextlib.asynccontextmanager
    async def close_engine_at_exit(_):
        # uvicorn re-raises the stop signal once it is done, ending the process before
        # anything after server.run() would run: the engine is closed here instead.
        try:
            yield
        finally:
            engine.close()
            logging.info("engine closed")

    app.router.lifespan_context = close_engine_at_exit
    # No access log below debug: a rollout step sends thousands of requests.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.log_level == "debug", timeout_keep_alive=5,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    _Server(config, app.state.service, args.model_path).run()


if __name__ == "__main__":
    main()
