"""The rollout engine a run samples with, chosen by `rollout.engine`.

  "jax"     in-process LanedEngine (engine/jax/lanes.py): the default, weights swapped in
            device memory.
  "sglang"  SGLangEngine (sglang/client.py) over `rollout.sglang.urls` (SGLang
            servers or agentjax's scripts/serve.py; with `rollout.sglang.router_url`,
            the workers of that sglang-router, which every request goes through), or over
            `rollout.sglang.launch` local serve.py servers started here from the run's
            initial weights and stopped when the run ends. Weights reach the servers as
            HF folders under `rollout.sglang.weights_dir` (default <workdir>/weights).

`build_engine` returns the engine and what closes it (the local servers too). Servers
that do not answer /health within `rollout.sglang.startup_timeout_s` are an
EnginesUnavailable naming them, raised before anything compiles.

With LoRA the in-process engine gets merged weights (the decoder's layerwise_weights
merge W + (alpha/r) A B in float32 at each sync). SGLang servers, under
rollout.sglang.lora="adapter", get a PEFT adapter folder per version over the base
they were launched with (model.path, or the stage's base export), loaded as an adapter
that every request names (sglang/client.py), the initial adapter at once so that no
request samples the bare base; under "merged", full merged HF folders, for servers
without LoRA.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from flax import nnx

from agentjax.models.hf import save_hf
from agentjax.models.lora import fold_adapters
from agentjax.models.peft import save_peft
from agentjax.engine.jax.lanes import LanedEngine
from agentjax.sglang.launch import LocalServers
from agentjax.sglang.client import SGLangEngine
from agentjax.config import sglang_logprob_distribution
from agentjax.config.rules import chunk_widths

WEIGHTS_DIR = "weights"  # in the workdir, unless rollout.sglang.weights_dir


def server_flags(config, lora=None) -> list[str]:
    """serve_main flags that make a launched server sample as the in-process engine
    would: same slots, lanes, decode rounds, compute dtype and seed, and `lora` (a
    models.lora.LoraConfig) when the servers load adapters. The context is one
    token longer than rollout.max_tokens because SGLang (and serve_main, which follows
    it) refuses input + max_new_tokens >= context length, while an episode may fill
    rollout.max_tokens exactly."""
    r = config.rollout
    flags = ["--max-running-requests", str(r.engine_slots), "--lanes", str(r.engine_lanes),
             "--decode-steps", str(r.decode_steps), "--context-length", str(r.max_tokens + 1),
             "--page-size", str(r.page_size), "--prefill-chunks", r.prefill_chunks,
             "--deterministic-prefill-rows", str(r.deterministic_prefill_rows),
             "--dtype", config.model.dtype, "--random-seed", str(config.seed),
             "--log-level", "warning"]
    if r.kv_tokens:
        flags += ["--max-total-tokens", str(r.kv_tokens)]
    if lora is not None and r.sglang.lora == "adapter":
        flags += ["--enable-lora", "--max-lora-rank", str(lora.rank),
                  "--lora-target-modules", *lora.projections]
    if not r.engine_overlap:
        flags.append("--disable-overlap-schedule")
    return flags + (["--enable-deterministic-inference"] if r.deterministic else [])


def kv_pages(rollout) -> int:
    """Pages of the JaxEngine pools over all lanes (`rollout.kv_tokens`; 0: room for
    every slot at max_tokens)."""
    per_sequence = -(-rollout.max_tokens // rollout.page_size)
    if rollout.kv_tokens == 0:
        return rollout.engine_slots * per_sequence
    lane_pages = -(-rollout.kv_tokens // (rollout.page_size * rollout.engine_lanes))
    return max(lane_pages, per_sequence) * rollout.engine_lanes


def build_engine(config, *, graphdef: nnx.GraphDef, params: Any, model_config, tokenizer,
                 model_path: str, workdir: str,
                 log: Callable[[str], None]) -> tuple[Any, Callable[[], None]]:
    """(engine, close) for `config.rollout.engine` (module docstring)."""
    r = config.rollout
    if r.engine == "jax":
        # Each lane keeps its own copy in the compute dtype (JaxEngine copies and casts),
        # so update steps may donate (free) the trainer's buffers.
        engine = LanedEngine.build(
            graphdef, params, lanes=r.engine_lanes, tokenizer=tokenizer,
            max_slots=r.engine_slots, max_len=r.max_tokens, decode_steps=r.decode_steps,
            page_size=r.page_size, kv_pages=kv_pages(r) // r.engine_lanes,
            prefill_chunks=chunk_widths(r.prefill_chunks),
            deterministic=r.deterministic,
            deterministic_prefill_rows=r.deterministic_prefill_rows,
            seed=config.seed, attention=r.engine_attention, overlap=r.engine_overlap)
        return engine, engine.close

    s = r.sglang
    lora = model_config.lora
    adapters = lora is not None and s.lora == "adapter"
    servers = None
    if s.launch:
        log(f"starting {s.launch} local rollout server(s) of {model_path}")
        servers = LocalServers.start(model_path, count=s.launch,
                                     flags=server_flags(config, lora),
                                     timeout_s=s.startup_timeout_s)
        urls = servers.urls
        log(f"local rollout servers at {', '.join(urls)}")
    else:
        urls = [u.strip() for u in s.urls.split(",")]

    def export(weights, folder):
        model = nnx.merge(graphdef, weights)
        if adapters:
            save_peft(model, folder, base_model=model_path)
            return
        if lora is not None:
            model = fold_adapters(model)
        save_hf(model, model.config, folder, dtype=model_config.dtype, tokenizer=tokenizer)

    engine = SGLangEngine(
        urls, tokenizer=tokenizer, export_fn=export,
        weights_dir=s.weights_dir or os.path.join(workdir, WEIGHTS_DIR),
        logprob_distribution=sglang_logprob_distribution(config), max_in_flight=s.max_in_flight,
        grace_s=s.grace_s, seed=config.seed, log=log,
        server_sessions=bool(s.launch) or s.server_sessions, lora=adapters,
        router_url=s.router_url or None)

    def close():
        engine.close()
        if servers is not None:
            servers.stop()

    try:
        engine.wait_until_ready(s.startup_timeout_s)
        if adapters:  # the servers hold the base: the policy is base + adapter
            engine.update_weights(params, version=engine.weight_version)
    except BaseException:
        close()
        raise
    return engine, close
