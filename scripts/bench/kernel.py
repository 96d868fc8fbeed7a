"""The engine's GPU paged-attention kernel (`models/paged_pallas.py`) against JAX's own
Pallas GPU paged-attention kernel (`jax.experimental.pallas.ops.gpu.paged_attention`,
deprecated; the engine ran it until 2026-12-05), on the same pool, in the same run.

    python scripts/bench/kernel.py --models 0.5B 3B        # GPU, seconds
    python scripts/bench/kernel.py --tiny                   # CPU, Pallas's interpreter

`scripts/bench/device.py` runs it per model beside the engine bench. Two calls of one
layer's attention, bf16, random pool and queries (values do not change the time):

- decode: `--batch` rows, one query each, every row holding `--context` slots (the
  middle of the device bench's generate: prompt + new / 2);
- prefill: `--prefill-rows` rows, a chunk of `--chunk` queries each at slots
  [context - chunk, context) (a prompt's last chunk).

JAX's kernel takes one query per batch entry ([B, H, hd], `lengths`): it runs the
R x T queries of a call as R x T entries with length slot + 1, each with its row's
block table, as the engine did with it; its pool is laid out [K, P, page, hd] (a copy,
made before timing). Its split plan is the engine's old one: up to 16 partitions of
power-of-two compute blocks of at most 8 pages. Printed per call: best seconds and
spread of each, the ratio (scripts/bench/timing.py: printed only where it exceeds the
spread), the KV bytes the call must read per second, and the largest difference
between the two outputs.
"""
from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from qwen25 import SHAPES, model_config  # scripts/bench/qwen25.py
from rollout import compilations, table  # scripts/bench/rollout.py
from timing import Ratio, Runs, measure, timed  # scripts/bench/timing.py

from agentjax.models.paged_pallas import (BlockTables, missing_backend, paged_attention_pallas,
                                          split_plan)

PAGE = 64
TINY_PAGE = 16


def jax_kernel():
    """JAX's paged-attention kernel, or None where this jax no longer ships it."""
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention
    except ImportError:
        return None
    return paged_attention.paged_attention


def old_split_plan(pages_per_row: int) -> tuple[int, int, int]:
    """The engine's split plan for JAX's kernel: (k_splits, block pages, table width)."""
    k_splits = min(16, pages_per_row)
    per_split = -(-pages_per_row // k_splits)
    block = min(8, 1 << (per_split.bit_length() - 1))
    per_split = -(-per_split // block) * block
    return k_splits, block, k_splits * per_split


def scene(config, rows: int, tokens: int, context: int, max_len: int, page: int, seed: int):
    """q [R, T, H, hd] at slots [context - T, context), a shuffled pool of R rows of
    max_len slots, their block tables [R, pages per row]."""
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    h, kh, hd = config.num_heads, config.num_kv_heads, config.head_dim
    per_row = -(-max_len // page)
    pages = rng.permutation(rows * per_row).reshape(rows, per_row).astype(np.int32)
    shape = (rows * per_row, kh, page, hd)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (rows, tokens, h, hd), jnp.bfloat16)
    k_pool = jax.random.normal(kk, shape, jnp.bfloat16)
    v_pool = jax.random.normal(kv, shape, jnp.bfloat16)
    slots = np.broadcast_to(np.arange(context - tokens, context, dtype=np.int32), (rows, tokens))
    return q, k_pool, v_pool, jnp.asarray(slots), pages


def calls(q, k_pool, v_pool, slots, pages, interpret: bool):
    """(ours, JAX's or None): calls of the same attention, each returning [R, T, H, hd].
    The arrays are the jitted functions' arguments (as constants, a 3B pool would be
    folded into the program)."""
    rows, tokens, heads, hd = q.shape
    page = v_pool.shape[2]
    k_splits, block, width = split_plan(pages.shape[1], page)
    ours_table = np.zeros((rows, width), np.int32)
    ours_table[:, :pages.shape[1]] = pages
    tables = BlockTables(table=jnp.asarray(ours_table), k_splits=k_splits, block_pages=block)
    attend = jax.jit(functools.partial(paged_attention_pallas, interpret=interpret))
    ours = functools.partial(attend, q, k_pool, v_pool, slots, tables)
    kernel = jax_kernel()
    if kernel is None:
        return ours, None
    old_splits, old_block, old_width = old_split_plan(pages.shape[1])
    old_table = np.zeros((rows, old_width), np.int32)
    old_table[:, :pages.shape[1]] = pages
    entries = jnp.asarray(np.repeat(old_table, tokens, axis=0))     # one per query
    lengths = (slots + 1).reshape(-1)
    k_heads, v_heads = (jnp.transpose(x, (1, 0, 2, 3)) for x in (k_pool, v_pool))

    @jax.jit
    def jax_attend(q, k_heads, v_heads, entries, lengths):
        scaled = (q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(rows * tokens, heads, hd)
        return kernel(scaled, k_heads, v_heads, entries, lengths, k_splits=old_splits,
                      pages_per_compute_block=old_block, num_warps=4,
                      interpret=interpret).reshape(q.shape)

    return ours, functools.partial(jax_attend, q, k_heads, v_heads, entries, lengths)


def kv_bytes(config, rows: int, context: int) -> int:
    """Keys and values a call must read at least once: each row's `context` slots (a
    chunk's queries attend the slots up to its last)."""
    return rows * context * 2 * config.num_kv_heads * config.head_dim * 2


def bench(name: str, config, *, batch: int, context: int, max_len: int, prefill_rows: int,
          chunk: int, page: int, repeats: int, interpret: bool) -> None:
    print(f"\n## Attention kernel at the {name} shape: {config.num_heads} heads, "
          f"{config.num_kv_heads} kv heads of {config.head_dim}, pages of {page}, max_len "
          f"{max_len}; ours (models/paged_pallas.py, split plan "
          f"{split_plan(-(-max_len // page), page)[:2]}) against JAX's ops/gpu kernel "
          f"(split plan {old_split_plan(-(-max_len // page))[:2]}); best of {repeats} "
          f"interleaved runs{' (interpreted)' if interpret else ''}")
    if jax_kernel() is None:
        print("JAX's kernel: not shipped by this jax; ours alone")
    rows_out = []
    for call, rows, tokens in (("decode", batch, 1), ("prefill chunk", prefill_rows, chunk)):
        q, k_pool, v_pool, slots, pages = scene(config, rows, tokens, context, max_len, page, 0)
        ours, theirs = calls(q, k_pool, v_pool, slots, pages, interpret)
        candidates = {"ours": timed(lambda f=ours: f().block_until_ready())}
        if theirs is not None:
            candidates["jax"] = timed(lambda f=theirs: f().block_until_ready())
        results = {key: Runs(tuple(v)) for key, v in
                   measure(candidates, repeats, compilations=compilations).items()}
        read = kv_bytes(config, rows, context)
        line = [f"{call}: {rows} x {tokens} queries at {context} slots",
                f"{results['ours'].best * 1e3:.3f} ({results['ours'].spread_text()})",
                f"{read / results['ours'].best / 1e9:.0f} GB/s"]
        if theirs is not None:
            diff = float(jnp.max(jnp.abs(ours().astype(jnp.float32)
                                         - theirs().astype(jnp.float32))))
            line += [f"{results['jax'].best * 1e3:.3f} ({results['jax'].spread_text()})",
                     f"{read / results['jax'].best / 1e9:.0f} GB/s",
                     Ratio.of(results["ours"], results["jax"]).text(), f"{diff:.1e}"]
        else:
            line += ["-"] * 4
        rows_out.append(line)
    table(["call", "ours ms (spread)", "ours KV read", "JAX's ms (spread)", "JAX's KV read",
           "ours / JAX's", "max |diff|"], rows_out)


def bench_model(name: str, *, batch: int, prompt: int, new_tokens: int, repeats: int,
                tiny: bool) -> None:
    """The kernel bench at the device bench's engine shape (device.py calls this)."""
    backend = jax.default_backend()
    why = (f"a GPU kernel ({backend})" if backend not in ("gpu", "cpu")
           else missing_backend())
    if why:
        print(f"\n## Attention kernel at the {name} shape: skipped, {why}")
        return
    config = model_config(*SHAPES[name], param_dtype="bfloat16", dtype="bfloat16")
    bench(name, config, batch=batch, context=prompt + new_tokens // 2,
          max_len=prompt + new_tokens, prefill_rows=min(batch, 8),
          chunk=min(256, prompt), page=TINY_PAGE if tiny else PAGE, repeats=repeats,
          interpret=backend == "cpu")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (CPU, interpreted)")
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=None)
    parser.add_argument("--batch", type=int, default=None, help="decode rows (64)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (1024)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens (1024)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    defaults = (dict(models=["tiny"], batch=4, prompt=16, new_tokens=16) if args.tiny else
                dict(models=["0.5B", "3B"], batch=64, prompt=1024, new_tokens=1024))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    print(f"agentjax kernel bench: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    for name in args.models:
        bench_model(name, batch=args.batch, prompt=args.prompt, new_tokens=args.new_tokens,
                    repeats=args.repeats, tiny=args.tiny)


if __name__ == "__main__":
    main()
