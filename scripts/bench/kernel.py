"""The engine's paged-attention kernels against the baselines they replace, on the same
pool, in the same run:

- GPU (`models/paged_pallas.py`) against JAX's own Pallas GPU paged-attention kernel
  (`jax.experimental.pallas.ops.gpu.paged_attention`, deprecated; the engine ran it
  until 2026-12-05);
- TPU (`models/paged_pallas_tpu.py`) against the pure-JAX paged attention the engine
  runs on a TPU under "auto" (`models/paged.py`) and JAX's ragged paged attention
  (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`, tpu-inference's RPA).

    python scripts/bench/kernel.py --models 0.5B 3B        # GPU or TPU, seconds
    python scripts/bench/kernel.py --tiny                   # CPU, Pallas's interpreters

`scripts/bench/device.py` runs it per model beside the engine bench. Two calls of one
layer's attention, bf16, random pool and queries (values do not change the time):

- decode: `--batch` rows, one query each, every row holding `--context` slots (the
  middle of the device bench's generate: prompt + new / 2);
- prefill: `--prefill-rows` rows, a chunk of `--chunk` queries each at slots
  [context - chunk, context) (a prompt's last chunk).

JAX's GPU kernel takes one query per batch entry ([B, H, hd], `lengths`): it runs the
R x T queries of a call as R x T entries with length slot + 1, each with its row's
block table, as the engine did with it; its pool is laid out [K, P, page, hd] (a copy,
made before timing). Its split plan is the engine's old one: up to 16 partitions of
power-of-two compute blocks of at most 8 pages. The pure-JAX path reads keys laid out
[P, K, hd, page] (a copy) and decodes over a view of the rows' pages gathered before
timing (the engine gathers it once per call of several steps and layers); RPA reads
keys and values interleaved [P, page, 2K, hd] (a copy). RPA does not run in Pallas's
interpreter, so on CPU the TPU kernel meets the pure-JAX path alone. Printed per call
and candidate: best seconds and spread, the KV bytes the call must read per second,
the ratio of the kernel to it (scripts/bench/timing.py: printed only where it exceeds
the spread) and the largest difference from the kernel's output.
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

from agentjax.models.paged import (ITEM_TILE, AttentionItems, ViewItems, build_items,
                                   items_needed, paged_attention, view_attention)
from agentjax.models.paged_pallas import (BlockTables, block_table, missing_backend,
                                          paged_attention_pallas, split_plan)
from agentjax.models.paged_pallas_tpu import (paged_attention_tpu, tpu_block_pages,
                                              tpu_table_width)

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


def gpu_calls(q, k_pool, v_pool, slots, pages, interpret: bool) -> dict:
    """{name: call} of the same attention on a GPU, each returning [R, T, H, hd]: ours
    first, then JAX's kernel where this jax ships it. The arrays are the jitted
    functions' arguments (as constants, a 3B pool would be folded into the program)."""
    rows, tokens, heads, hd = q.shape
    page = v_pool.shape[2]
    k_splits, block, width = split_plan(pages.shape[1], page)
    tables = BlockTables(table=jnp.asarray(block_table(pages, rows, width)), k_splits=k_splits,
                         block_pages=block)
    attend = jax.jit(functools.partial(paged_attention_pallas, interpret=interpret))
    calls = {"ours": functools.partial(attend, q, k_pool, v_pool, slots, tables)}
    kernel = jax_kernel()
    if kernel is None:
        return calls
    old_splits, old_block, old_width = old_split_plan(pages.shape[1])
    entries = jnp.asarray(np.repeat(block_table(pages, rows, old_width), tokens, axis=0))
    lengths = (slots + 1).reshape(-1)
    k_heads, v_heads = (jnp.transpose(x, (1, 0, 2, 3)) for x in (k_pool, v_pool))

    @jax.jit
    def jax_attend(q, k_heads, v_heads, entries, lengths):
        scaled = (q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(rows * tokens, heads, hd)
        return kernel(scaled, k_heads, v_heads, entries, lengths, k_splits=old_splits,
                      pages_per_compute_block=old_block, num_warps=4,
                      interpret=interpret).reshape(q.shape)

    calls["JAX's ops/gpu"] = functools.partial(jax_attend, q, k_heads, v_heads, entries,
                                               lengths)
    return calls


def tpu_calls(q, k_pool, v_pool, slots, pages, interpret: bool) -> dict:
    """{name: call} of the same attention on a TPU (`gpu_calls`): ours, the pure-JAX
    paged attention, and RPA (not interpreted)."""
    rows, tokens, heads, hd = q.shape
    page = v_pool.shape[2]
    block = tpu_block_pages(page)
    table = block_table(pages, rows, tpu_table_width(pages.shape[1], page))
    tables = BlockTables(table=jnp.asarray(table), block_pages=block, kernel="pallas_tpu")
    attend = jax.jit(functools.partial(paged_attention_tpu, interpret=interpret))
    calls = {"ours": functools.partial(attend, q, k_pool, v_pool, slots, tables)}

    spans = [int(s) + 1 for s in np.asarray(slots)[:, -1]]
    tile = 1 if tokens == 1 else ITEM_TILE      # a decode view's items, prefill's tiles
    host = build_items([list(row) for row in pages], spans, rows, page,
                       items_needed(spans, page, tile), tile=tile)
    items = AttentionItems(*(jnp.asarray(x) for x in (host.row, host.page, host.first_slot)))
    k_hd = jnp.transpose(k_pool, (0, 1, 3, 2))
    if tokens == 1:
        k_view, v_view = (jnp.take(x, items.page, axis=0) for x in (k_hd, v_pool))
        calls["pure JAX"] = functools.partial(jax.jit(view_attention), q, k_view, v_view,
                                              slots, ViewItems.of(items, rows))
    else:
        calls["pure JAX"] = functools.partial(jax.jit(paged_attention), q, k_hd, v_pool,
                                              slots, items)
    if interpret:
        return calls
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (
        ragged_paged_attention)

    kv_pages = jnp.stack([jnp.transpose(x, (0, 2, 1, 3)) for x in (k_pool, v_pool)], axis=3)
    kv_pages = kv_pages.reshape(*kv_pages.shape[:2], -1, hd)      # [P, page, 2K, hd]

    @jax.jit
    def rpa(q, kv_pages, kv_lens, page_indices, cu_q_lens):
        out = ragged_paged_attention(q.reshape(rows * tokens, heads, hd), kv_pages, kv_lens,
                                     page_indices, cu_q_lens, jnp.array([rows], jnp.int32),
                                     sm_scale=hd ** -0.5)
        return out.reshape(q.shape)

    calls["JAX's RPA"] = functools.partial(
        rpa, q, kv_pages, jnp.asarray(spans, jnp.int32), jnp.asarray(pages),
        jnp.arange(rows + 1, dtype=jnp.int32) * tokens)
    return calls


def kv_bytes(config, rows: int, context: int) -> int:
    """Keys and values a call must read at least once: each row's `context` slots (a
    chunk's queries attend the slots up to its last)."""
    return rows * context * 2 * config.num_kv_heads * config.head_dim * 2


def bench(name: str, config, *, platform: str, batch: int, context: int, max_len: int,
          prefill_rows: int, chunk: int, page: int, repeats: int, interpret: bool) -> None:
    pages_per_row = -(-max_len // page)
    plan = (f"split plan {split_plan(pages_per_row, page)[:2]} against JAX's ops/gpu "
            f"kernel's {old_split_plan(pages_per_row)[:2]}" if platform == "gpu" else
            f"compute blocks of {tpu_block_pages(page)} pages")
    print(f"\n## {platform.upper()} attention kernel at the {name} shape: "
          f"{config.num_heads} heads, {config.num_kv_heads} kv heads of {config.head_dim}, "
          f"pages of {page}, max_len {max_len}; {plan}; best of {repeats} interleaved runs"
          f"{' (interpreted)' if interpret else ''}")
    make_calls = gpu_calls if platform == "gpu" else tpu_calls
    if platform == "gpu" and jax_kernel() is None:
        print("JAX's kernel: not shipped by this jax; ours alone")
    rows_out = []
    for call, rows, tokens in (("decode", batch, 1), ("prefill chunk", prefill_rows, chunk)):
        q, k_pool, v_pool, slots, pages = scene(config, rows, tokens, context, max_len, page, 0)
        calls = make_calls(q, k_pool, v_pool, slots, pages, interpret)
        for key in [key for key in calls if key != "ours"]:
            try:        # a baseline this jax or device cannot run is named, not fatal
                calls[key]().block_until_ready()
            except Exception as error:  # noqa: BLE001
                print(f"{call}: {key} failed, left out: {type(error).__name__}: "
                      f"{str(error)[:300]}")
                del calls[key]
        candidates = {key: timed(lambda f=f: f().block_until_ready())
                      for key, f in calls.items()}
        results = {key: Runs(tuple(v)) for key, v in
                   measure(candidates, repeats, compilations=compilations).items()}
        read = kv_bytes(config, rows, context)
        ours = calls["ours"]().astype(jnp.float32)
        for key, runs in results.items():
            line = [f"{call}: {rows} x {tokens} queries at {context} slots", key,
                    f"{runs.best * 1e3:.3f} ({runs.spread_text()})",
                    f"{read / runs.best / 1e9:.0f} GB/s"]
            if key == "ours":
                line += ["", ""]
            else:
                diff = float(jnp.max(jnp.abs(ours - calls[key]().astype(jnp.float32))))
                line += [Ratio.of(results["ours"], runs).text(), f"{diff:.1e}"]
            rows_out.append(line)
    table(["call", "attention", "ms (spread)", "KV read", "ours / it", "max |diff|"],
          rows_out)


def bench_model(name: str, *, batch: int, prompt: int, new_tokens: int, repeats: int,
                tiny: bool) -> None:
    """The kernel bench at the device bench's engine shape (device.py calls this)."""
    backend = jax.default_backend()
    config = model_config(*SHAPES[name], param_dtype="bfloat16", dtype="bfloat16")
    # On CPU both kernels run in Pallas's interpreters, so neither can rot unseen.
    platforms = {"gpu": ["gpu"], "tpu": ["tpu"], "cpu": ["gpu", "tpu"]}.get(backend, [])
    for platform in platforms:
        if platform == "gpu" and missing_backend() is not None:
            print(f"\n## GPU attention kernel at the {name} shape: skipped, "
                  f"{missing_backend()}")
            continue
        bench(name, config, platform=platform, batch=batch, context=prompt + new_tokens // 2,
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
