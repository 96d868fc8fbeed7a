"""JaxEngine: the in-process rollout engine (continuous batching over a paged KV cache).

    engine = JaxEngine.from_model(model, tokenizer=tok, max_slots=32, max_len=1024)
    [[completion]] = await engine.generate([GenerateRequest(ids, SamplingParams(...))])
    engine.update_weights(new_params, version=3)     # in place, no recompilation

The scheduler is one thread's state machine (intake, admission, prefill and decode
rounds, finishing). What it drives lives beside it: the device programs and the page
pool in `engine/jax/programs.py` (attention in `models/paged.py`, on GPU the Pallas
kernel of `models/paged_pallas.py`), the shape of each
call in `engine/jax/shapes.py`, the pages, sessions and shared contexts in
`engine/jax/pages.py`.

Design:
- KV pages: a pool of `kv_pages` pages of `page_size` slots, allocated as tokens arrive
  and freed when a sequence ends; max_len caps a request, it reserves nothing. Every
  call attends only the pages its rows hold (a work list of (row, page) items), so cost
  follows the tokens in flight, not max_len nor the longest row. When pages run out,
  shared contexts and then (unless deterministic) parked sessions are dropped, then
  requests wait; a request that can never fit is aborted with the reason.
- Prefill: each admitted sequence's context but its last token goes into right-padded
  [R, C] chunks, C picked per sequence from its own remaining tokens; the sequences of a
  round are grouped by C, one call per group. The last context token is fed by the
  first decode step, which samples the first token. Prefill comes first: every
  admitted sequence prefills all its chunks before the next decode round (as SGLang's
  scheduler, unless its mixed chunks are on), and admission runs again after each
  prefill round (the siblings of a prompt just prefilled share it at once), so a decode
  call batches every row in flight. Interleaved, the short rows of a batch would finish
  while a long prompt still prefilled, and its row then decode alone in as many calls
  again; a GRPO group would decode one call out of phase with its first sample.
- Shared contexts: a sequence whose context another prefilled (the same ids, and its
  cached slots computed the same way) prefills nothing: it shares that sequence's pages
  (copy-on-write), so a GRPO group's prompt is prefilled once, and so is each later
  turn's context that several of its samples reach alike (`engine/jax/pages.py`).
- Decode: one program call runs `decode_steps` tokens over the decoding rows. With the
  pure-JAX attention the call copies the pages its rows attend into a view
  (`paged.gather_view`); rows that share a prompt attend its pages each, so a round is
  split into calls whose views hold at most kv_pages pages: the view never outgrows the
  pool. Stop strings are checked on the host by decoding a window of each row's newest
  tokens; tokens sampled after a stop string are discarded and the sequence's length
  rolled back.
- Compilations: one decode program per (rows, attention items) and one prefill program
  per (rows, chunk, attention items), compiled when first used; `warmup()` compiles
  them all upfront.
- Continuous batching: a scheduler thread admits waiting requests (up to max_slots in
  flight) between decode rounds; when idle it waits `batch_wait_s` after the first
  arrival to gather concurrent callers. Sequences finish independently.
- Sessions (`GenerateRequest.session_id`): after a turn the session keeps its pages and
  its next request prefills only past their common prefix.
- Sampling and log-probs: `engine/jax/sampling.py` (temperature, then top-k, then top-p,
  renormalized; the returned log-prob is that of the distribution sampled from; greedy
  reports the untempered log-prob). Each sequence's key is `fold_in(PRNGKey(seed),
  sample_index)` (or drawn from the engine's stream when `seed` is None), and the token
  sampled for absolute position t uses `fold_in(key, t)`: a seeded request draws the
  same noise whatever shares its batch, and the turns of a seeded episode (later
  positions) get fresh randomness.
- Weights: `update_weights` copies the new params into the engine (same structure,
  shapes, dtypes and shardings as before — checked), cast to the model's compute dtype
  (`config.dtype`: float32 master weights become a bfloat16 copy), so nothing
  recompiles and the trainer may donate its own buffers afterwards. The swap happens
  between rounds, also while sequences are in flight; every page written by the old
  weights is dropped then: parked sessions and shared contexts end, and a sequence in
  flight prefills its context so far again with the new weights before it samples on
  (`meta["recomputed"]`), so no old-policy key is ever attended after a swap. Each
  output token's weight version is reported (`meta["token_versions"]`).
- Sharding: params may live on a mesh (e.g. `parallel.shard_model`); the pool is then
  placed on it by `PagedKVCache.logical_axes` and the rules the model was sharded with
  (`programs.new_cache`), and jit propagates the rest.
- Overlap (`overlap=True`, SGLang's overlap scheduler): while nothing else needs the
  scheduler (its inbox is empty, no waiting sequence could take a free row, none sat
  out the call for lack of pages, none was cancelled), the next decode call over the
  rows that go on is dispatched before the host reads the current one, so the host's
  work between calls (recording tokens, stop strings, the next call's arrays) runs
  while the device computes. The host gives each row the
  slots and pages it needs if it emits every step; its last token, and whether it
  sampled a stop id, reach the next call on device (`programs.DecodeCarry`). A row that
  ended at a stop string, which only the host sees, ran one call too far: those tokens
  are dropped (`stats["dropped_decode_tokens"]`), their slots lie past its length.
  Anything else (a request, a weight swap, a cancellation) waits until the call in
  flight is read: the scheduler then runs as without overlap. Deterministic mode keeps
  its guarantee (every decode call runs max_slots rows either way); in default mode a
  row that stopped in the call before may still count toward the next call's rows.
  The prefill calls of a round are dispatched back to back and waited for once (their
  outputs are the pool alone), whether overlap is on or off.
- Host time: `stats["host_gap_s"]` sums the time the device sat idle between two calls
  while the scheduler had work (from reading one call to dispatching the next;
  overlapped calls add none). `scripts/bench/engine.py` prints it per decode call.

Batch invariance (`deterministic=True`). Same noise is not same tokens: XLA:CPU's matmul
result for a row depends on the program's row count (a row of `x[:k] @ w` differs from
the same row of `x @ w` by ~1e-5), and the default scheduler picks row counts from
whatever happens to be in flight, so a near-tie between two tokens can resolve
differently from run to run. For a fixed row count a row's result does not depend on
its row index or on the other rows' contents, and the paged attention of a row does not
depend on the other rows' items (`models/paged.py`), so in deterministic mode every
call a sequence passes through has a row count that does not depend on the other
sequences: decode always runs max_slots rows, prefill `deterministic_prefill_rows`;
chunk boundaries depend only on the sequence's own tokens (`ProgramShapes.chunk_width`,
from the cached prefix its session holds). A seeded request's output ids and log-probs
are then bitwise identical whatever else runs, in whatever order requests arrive (same
engine settings, same machine and XLA build), while each call still pays only for the
tokens its rows hold. A parked session is never evicted (re-prefilling its history
would compute its keys in another program than the decode steps that wrote them): the
caller keeps sessions within the page pool (`end_session` when an episode ends); a
request that finds the pool held by parked sessions is aborted with that error rather
than left waiting. Weight swaps change outputs, as they should; the caller makes them at
the same points.

Compilations of the device programs are counted process-wide (`compile_counts`). Weights
and cache are committed to their devices at construction, and `update_weights` places new
params on the same shardings, so a weight swap hits the same executables.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import queue
import threading
import time
import traceback
import warnings
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.config.choices import ENGINE_ATTENTION, KERNEL_PAGE_SIZES
from agentjax.models.decoder import LayerwiseWeights
from agentjax.models.paged import AttentionItems, build_items, items_needed, page_bytes
from agentjax.models import paged_pallas, paged_pallas_tpu
from agentjax.models.paged_pallas import BlockTables, block_table, missing_backend
from agentjax.engine.jax.programs import (COMPILE_COUNTS, DecodeCarry, carry_sharding,
                                          copy_pages, decode, engine_weights, new_cache,
                                          prefill)
from agentjax.engine.protocol import (Completion, GenerateRequest, SamplingParams,
                                     check_request, reported_distribution)
from agentjax.engine.jax.shapes import TILES, ProgramShapes
from agentjax.engine.jax.sampling import fold_in_data, prng_key_data
from agentjax.engine.jax.pages import PageTable


class _StopStrings:
    """Detects the first token whose decoded text completes a stop string.

    Every byte of a stop string belongs to exactly one token, so an occurrence completed
    by the newest token lies within the last `window` tokens (window = longest stop
    string in bytes); only that window is decoded.
    """

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 1

    def match(self, output_ids: Sequence[int]) -> str | None:
        if not self.stops:
            return None
        text = self.tokenizer.decode(list(output_ids[-self.window:]), skip_special_tokens=False)
        for stop in self.stops:
            if stop in text:
                return stop
        return None


@dataclasses.dataclass(eq=False)
class _Sequence:
    """One completion being produced (a request with n > 1 makes n of these)."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None
    key: np.ndarray
    stop_ids: frozenset
    stop_strings: _StopStrings
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    pages: list[int] = dataclasses.field(default_factory=list)
    length: int = 0  # slots of `pages` filled: the context ids but the last
    segments: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # prefilled
    outputs: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # weight version per output
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    cancelled: bool = False
    finished: bool = False

    @property
    def context_length(self) -> int:
        """Input and output ids so far."""
        return len(self.input_ids) + len(self.outputs)

    def context(self, start: int, stop: int) -> tuple[int, ...]:
        """Context ids [start, stop) (input then outputs), 0 <= start <= stop."""
        prompt = len(self.input_ids)
        if stop <= prompt:
            return self.input_ids[start:stop]
        return self.input_ids[start:] + tuple(self.outputs[max(start - prompt, 0):stop - prompt])

    @property
    def decoding(self) -> bool:
        """Every context id but the last is cached: the next decode step feeds it."""
        return self.length == self.context_length - 1


class _Row(NamedTuple):
    """A decode call's row: `steps` tokens for `seq`, after the `ahead` tokens a call
    not read yet makes for it (whose row `src` it continues; -1: none)."""

    seq: _Sequence
    steps: int
    ahead: int = 0
    src: int = -1

    @property
    def start(self) -> int:
        """The slot of the row's first step."""
        return self.seq.length + self.ahead

    @property
    def end(self) -> int:
        return self.start + self.steps


@dataclasses.dataclass(eq=False)
class _DecodeCall:
    """A dispatched decode call: its rows and its outputs on device."""

    rows: list[_Row]
    outputs: tuple  # tokens, logprobs, emitted
    dispatched: float


class JaxEngine:
    """In-process batched sampler implementing the Engine protocol (module docstring).

    Args:
      graphdef: the model's graphdef (`nnx.split(model)`).
      params: the model's params (`nnx.split(model)`), possibly sharded on a mesh.
      tokenizer: needed for stop strings (and supplies the default eos ids).
      max_slots: sequences in flight at once (the decode batch).
      max_len: the most context ids (prompt + output) of one sequence; a cap, not a
        reservation.
      prefill_chunks: chunk lengths for prefill programs (a sequence's tokens are
        prefilled in rounds of these widths, see `ProgramShapes.chunk_width`).
      batch_buckets: row counts of calls: a prefill or decode call over n sequences runs
        the smallest bucket >= n rows (padding rows are inert), more than the largest
        run max_slots rows. Default: 1, 4, 16, 64, ... below max_slots.
      decode_steps: tokens per decode program call (host round trip).
      page_size: slots per KV page.
      kv_pages: pages in the pool (default: enough for max_slots sequences of max_len,
        so nothing ever waits for pages; set it to the tokens a workload really holds,
        `rollout.kv_tokens`, to use less memory).
      batch_wait_s: when idle, how long to wait after a request for concurrent ones.
      eos_token_ids: ids that always end generation (default: the model config's eos
        ids — `models.hf.load_hf` adds generation_config.json's — plus, with a
        tokenizer, its eos and its chat template's end-of-turn token).
      max_stop_ids: most stop ids per request (static width of the device stop table).
      cache_dtype: KV cache dtype (default: the model's compute dtype).
      seed: seed of the engine's stream for requests without a seed.
      deterministic: batch-invariant mode (module docstring): a seeded request's output
        ids and log-probs are bitwise identical whatever else is in flight. Every decode
        call runs max_slots rows (`batch_buckets` is unused), every prefill call
        `deterministic_prefill_rows` rows; parked sessions are never evicted, so the
        caller must end finished sessions: a request that finds the pool held by parked
        sessions comes back with finish_reason "abort".
      deterministic_prefill_rows: rows of every prefill call in deterministic mode.
      attention: "paged" (the pure-JAX loop over each row's pages, `models/paged.py`),
        "pallas_gpu" (a Pallas GPU paged-attention kernel, `models/paged_pallas.py`;
        page_size a power of two >= 16), "pallas_tpu" (a Pallas TPU one,
        `models/paged_pallas_tpu.py`; page_size a multiple of 16) or "auto": pallas_gpu
        when the weights are on a GPU, else paged. Off their device the kernels run in
        Pallas's interpreters, for tests.
      overlap: dispatch each decode call's successor before reading its tokens while
        nothing else needs the scheduler, so the host's work for a call runs while the
        device runs the next (module docstring). Outputs are the same either way in
        deterministic mode.

    Attributes:
      weight_version: version of the params in use (see `update_weights`).
      deterministic: whether the engine runs in batch-invariant mode.
      stats: counters: {prefill,decode}_{calls,tokens,s}, max_{prefill,decode}_batch,
        host_gap_s, overlapped_decode_calls (dispatched before the previous call was
        read), host_bound_decode_calls (overlapped, but the previous call had finished:
        the device waited for the host), dropped_decode_tokens (sampled for a sequence
        that had ended at a stop string after the call was dispatched), evictions,
        shared_prefixes, contexts_reclaimed (shared contexts dropped for pages),
        preemptions, peak_kv_pages (pages in use, shared contexts
        included: a cache reclaimed when pages run out), peak_kv_pages_held (those a
        sequence or a parked session holds, sampled after each program call) and
        kv_page_bytes (bytes of one page).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        params: Any,
        *,
        tokenizer=None,
        max_slots: int = 16,
        max_len: int = 1024,
        prefill_chunks: Sequence[int] = (16, 64, 256),
        batch_buckets: Sequence[int] | None = None,
        decode_steps: int = 8,
        page_size: int = 64,
        kv_pages: int | None = None,
        batch_wait_s: float = 0.002,
        eos_token_ids: Sequence[int] | None = None,
        max_stop_ids: int = 8,
        cache_dtype=None,
        seed: int = 0,
        deterministic: bool = False,
        deterministic_prefill_rows: int = 4,
        attention: str = "auto",
        overlap: bool = True,
    ):
        if (max_slots < 1 or max_len < 2 or decode_steps < 1 or deterministic_prefill_rows < 1
                or page_size < 1):
            raise ValueError(
                f"need max_slots >= 1, max_len >= 2, decode_steps >= 1, page_size >= 1, "
                f"deterministic_prefill_rows >= 1; got {max_slots}, {max_len}, {decode_steps}, "
                f"{page_size}, {deterministic_prefill_rows}")
        if not prefill_chunks or min(prefill_chunks) < 1:
            raise ValueError(f"prefill_chunks must be positive lengths, got {prefill_chunks!r}")
        self._graphdef = graphdef
        leaves, self._params_tree = jax.tree.flatten(params)
        # Shapes, dtypes and shardings new weights must have (update_weights).
        self._param_specs = [(tuple(x.shape), x.dtype, x.sharding) for x in leaves]
        self._param_paths = [jax.tree_util.keystr(path) for path, _ in
                             jax.tree_util.tree_leaves_with_path(params)]
        self._weights = self._engine_weights(leaves)
        self.config = self._weights.config
        self.tokenizer = tokenizer
        self.max_slots, self.max_len = max_slots, max_len
        self.deterministic = deterministic
        self.deterministic_prefill_rows = deterministic_prefill_rows
        self.decode_steps = decode_steps
        self.attention = resolve_attention(
            attention, next(iter(jax.tree.leaves(self._weights)[0].devices())).platform,
            page_size)
        kernel = self.attention != "paged"
        self._key_layout = "page_hd" if kernel else "hd_page"
        self.page_size = page_size
        self.kv_pages = max_slots * -(-max_len // page_size) if kv_pages is None else kv_pages
        if self.kv_pages < 1:
            raise ValueError(f"kv_pages must be positive, got {kv_pages}")
        # A decode call's view holds at most the pool's page count (module docstring).
        self._shapes = ProgramShapes(
            max_slots, max_len, page_size, prefill_chunks=prefill_chunks,
            batch_buckets=batch_buckets, deterministic=deterministic,
            deterministic_prefill_rows=deterministic_prefill_rows,
            block_tables=kernel, view_pages=self.kv_pages)
        self._kernel_plan = (kernel_plan(self.attention, self._shapes.pages_per_row, page_size)
                            if kernel else None)
        self.batch_wait_s = batch_wait_s
        self.max_stop_ids = max_stop_ids
        if eos_token_ids is None:
            eos_token_ids = _default_eos_ids(tokenizer, self.config)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._cache_dtype = self.config.dtype if cache_dtype is None else cache_dtype
        self._cache = new_cache(self._weights, self.config, self.kv_pages, page_size,
                                self._cache_dtype, self._key_layout)
        self._kernel_mesh = kernel_mesh(self._cache) if kernel else {}
        self.stats = collections.Counter()
        self.stats["kv_page_bytes"] = page_bytes(self.config, page_size, self._cache_dtype)
        # Shared contexts are reclaimed when pages run out; the count bound only caps the
        # host memory of their keys. A GRPO group's siblings may start a turn apart (as
        # rows free up), so a sync RL step's contexts (episodes x turns) should all fit.
        self._table = PageTable(self.kv_pages, page_size, evict_parked=not deterministic,
                                stats=self.stats, max_contexts=8 * max_slots)
        self._in_flight: list[_Sequence] = []
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._inbox: queue.Queue = queue.Queue()
        self._base_key = prng_key_data(seed)
        self._unseeded = itertools.count()
        self._device_done: float | None = None  # when the device last went idle
        self.overlap = overlap
        self._carry_sharding = carry_sharding(self._cache)
        self._carry = jax.device_put(DecodeCarry.empty(max_slots), self._carry_sharding)
        self._unread = 0  # decode calls dispatched, not read yet
        self._last_read = 0.0  # when the host last read a decode call
        self.weight_version = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="jax-engine", daemon=True)
        self._thread.start()

    def _engine_weights(self, leaves: Sequence[jax.Array]) -> LayerwiseWeights:
        """The engine's own weights from param leaves: placed on the construction
        shardings (a no-op when they are already there: no second full-precision copy),
        then split per layer and cast to the compute dtype into fresh buffers (the
        caller may donate or mutate its own afterwards)."""
        placed = [jax.device_put(x, sharding, may_alias=True)
                  for x, (_, _, sharding) in zip(leaves, self._param_specs)]
        return engine_weights(self._graphdef, jax.tree.unflatten(self._params_tree, placed))

    @classmethod
    def from_model(cls, model: nnx.Module, **kwargs) -> "JaxEngine":
        """Builds an engine from a Decoder (`nnx.split` is applied); kwargs as __init__."""
        graphdef, params = nnx.split(model)
        return cls(graphdef, params, **kwargs)

    # ---------------------------------------------------------------- Engine protocol

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Samples every request; returns its `n` completions per request, in order.

        Raises ValueError (naming the request) for invalid sampling parameters or ids;
        a request that does not fit the cache comes back with finish_reason "abort".
        """
        if self._closed:
            raise RuntimeError("JaxEngine is closed")
        loop = asyncio.get_running_loop()
        per_request = []
        for index, request in enumerate(requests):
            self._validate(index, request)
            per_request.append([self._make_sequence(request, i, loop)
                                for i in range(request.sampling.n)])
        for seqs in per_request:
            for seq in seqs:
                seq.future.add_done_callback(functools.partial(_mark_cancelled, seq))
                self._inbox.put(("sequence", seq))
        results = await asyncio.gather(*(seq.future for seqs in per_request for seq in seqs))
        out, flat = [], iter(results)
        for seqs in per_request:
            out.append([next(flat) for _ in seqs])
        return out

    def generate_sync(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """`generate` for callers without an event loop."""
        return asyncio.run(self.generate(requests))

    def update_weights(self, weights: Any, *, version: int | None = None) -> None:
        """Swaps in new params (same tree, shapes, dtypes; copied onto the current
        shardings) between decode rounds; every page written by the old weights is
        dropped (module docstring). No recompilation.

        Args:
          weights: params with the structure of `nnx.split(model)[1]`.
          version: recorded as `meta["weight_version"]` (default: previous + 1).
        """
        new_leaves, new_tree = jax.tree.flatten(weights)
        if new_tree != self._params_tree:
            raise ValueError(
                f"update_weights: params tree differs from the engine's:\n{new_tree}\nvs\n"
                f"{self._params_tree}")
        for path, (shape, dtype, _), new in zip(self._param_paths, self._param_specs,
                                                new_leaves):
            if tuple(new.shape) != shape or jnp.dtype(new.dtype) != dtype:
                raise ValueError(
                    f"update_weights: {path} has {jnp.dtype(new.dtype).name}"
                    f"{tuple(new.shape)}, the engine expects {dtype.name}{shape}")
        self._call_scheduler("weights", (self._engine_weights(new_leaves), version))

    def health(self) -> bool:
        """True while the scheduler thread runs."""
        return not self._closed and self._thread.is_alive()

    def end_session(self, session_id: str) -> None:
        """Frees the session's pages (asynchronously, in the scheduler thread)."""
        self._inbox.put(("end_session", session_id))

    # ---------------------------------------------------------------- public extras

    def warmup(self) -> int:
        """Compiles every program the engine can call (`ProgramShapes.programs`) with
        inert inputs, so later requests never wait on XLA; returns the number of programs.
        Safe while requests run."""
        self._call_scheduler("warmup", None)
        return len(self._shapes.programs())

    @property
    def compile_counts(self) -> dict[str, int]:
        """XLA compilations of the engine's programs so far, process-wide."""
        return dict(COMPILE_COUNTS)

    def _call_scheduler(self, kind: str, payload: Any) -> None:
        """Posts a control message to the scheduler thread and waits until it is done;
        re-raises what it raised."""
        done, outcome = threading.Event(), {}
        self._inbox.put((kind, (payload, done, outcome)))
        while not done.wait(timeout=1.0):
            if not self.health():
                raise RuntimeError(f"{kind}: the engine is not running")
        if "error" in outcome:
            raise RuntimeError(f"{kind} failed in the engine thread") from outcome["error"]

    def close(self) -> None:
        """Stops the scheduler thread; in-flight requests are aborted."""
        if not self._closed:
            self._closed = True
            self._inbox.put(("stop", None))
            self._thread.join(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- request intake

    def _validate(self, index: int, request: GenerateRequest) -> None:
        s = request.sampling
        where = check_request(index, request)
        if max(request.input_ids) >= self.config.vocab_size:
            raise ValueError(f"{where}.input_ids must be in [0, {self.config.vocab_size})")
        if len(set(s.stop_token_ids) | set(self.eos_token_ids)) > self.max_stop_ids:
            raise ValueError(f"{where}: more than max_stop_ids={self.max_stop_ids} stop ids")
        if s.stop and self.tokenizer is None:
            raise ValueError(f"{where}: stop strings need JaxEngine(tokenizer=...)")

    def _make_sequence(self, request: GenerateRequest, sample_index: int, loop) -> _Sequence:
        s = request.sampling
        if s.seed is None:
            base = fold_in_data(self._base_key, next(self._unseeded))
        else:
            base = fold_in_data(prng_key_data(s.seed), sample_index)
        return _Sequence(
            input_ids=tuple(map(int, request.input_ids)), sampling=s,
            session_id=request.session_id, key=base,
            stop_ids=frozenset(s.stop_token_ids) | frozenset(self.eos_token_ids),
            stop_strings=_StopStrings(self.tokenizer, s.stop),
            future=loop.create_future(), loop=loop)

    # ---------------------------------------------------------------- scheduler thread

    def _serve(self) -> None:
        while True:
            try:
                if not self._receive():
                    break
                progressed = False
                while True:  # prefill first (module docstring), admitting as it goes
                    self._drop_cancelled()  # a long prompt's caller may give up meanwhile
                    self._admit()
                    if not self._prefill_round():
                        break
                    progressed = True
                progressed = self._decode_round() or progressed
                if self._in_flight and not progressed:
                    self._resolve_starvation()
            except Exception as error:  # noqa: BLE001 - never let the thread die
                self._abort_all(f"engine error: {type(error).__name__}: {error}",
                                traceback.format_exc())
        self._abort_all("engine closed", None)

    def _busy(self) -> bool:
        return bool(self._waiting) or bool(self._in_flight)

    def _receive(self) -> bool:
        """Handles inbox messages (blocking while idle); False once asked to stop."""
        messages = []
        if not self._busy():
            self._device_done = None  # idle time is no host gap
            messages.append(self._inbox.get())
            deadline = time.perf_counter() + self.batch_wait_s
            while messages[-1][0] == "sequence" and (left := deadline - time.perf_counter()) > 0:
                try:
                    messages.append(self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for kind, payload in messages:
            if kind == "stop":
                return False
            if kind == "sequence":
                self._enqueue(payload)
            elif kind == "end_session":
                self._table.end_session(payload)
            else:
                self._control(kind, *payload)
        return True

    def _control(self, kind: str, payload: Any, done: threading.Event, outcome: dict) -> None:
        """Runs a `_call_scheduler` message ("warmup" or "weights")."""
        try:
            if kind == "warmup":
                self._warmup()
            else:
                self._weights, version = payload
                self.weight_version = self.weight_version + 1 if version is None else version
                self._drop_old_pages()
        except Exception as error:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = error
        finally:
            done.set()

    def _drop_old_pages(self) -> None:
        """After a weight swap: no page written by the old weights is attended again.
        Parked sessions and shared contexts end; sequences in flight prefill their
        context again."""
        self._table.drop_cached()
        for seq in self._in_flight:
            if seq.length:
                seq.meta["recomputed"] = seq.meta.get("recomputed", 0) + 1
            self._table.recompute(seq)

    def _warmup(self) -> None:
        """Runs every program once on inert rows (all padding / inactive: no page
        changes)."""
        for kind, rows, width, items in self._shapes.programs():
            if kind == "prefill":
                self._run_prefill([], rows, width, items)
            else:
                self._read_decode(self._dispatch_decode([], rows, items))
        self._copy_pages([])
        jax.block_until_ready(self._cache)

    def _enqueue(self, seq: _Sequence) -> None:
        if len(seq.input_ids) > self.max_len:
            self._finish(seq, "abort", None, error=(
                f"input of {len(seq.input_ids)} tokens does not fit max_len={self.max_len}"))
            return
        need = self._table.pages_for(len(seq.input_ids) - 1 + self.decode_steps)
        if need > self.kv_pages:
            self._finish(seq, "abort", None, error=(
                f"input of {len(seq.input_ids)} tokens needs {need} KV pages, the pool has "
                f"kv_pages={self.kv_pages} of {self.page_size} slots"))
            return
        seq.meta["weight_version_start"] = self.weight_version
        self._waiting.append(seq)

    def _drop_cancelled(self) -> None:
        self._waiting = collections.deque(s for s in self._waiting if not s.cancelled)
        for seq in [s for s in self._in_flight if s.cancelled]:
            self._release(seq)

    def _release(self, seq: _Sequence, park: bool = True) -> None:
        self._in_flight.remove(seq)
        self._table.release(seq, park=park)

    def _admit(self) -> None:
        """Moves waiting sequences in flight (those whose session holds pages first),
        while rows and pages allow (`PageTable.admit`)."""
        sessions = self._table.sessions
        ordered = sorted(self._waiting, key=lambda s: not (
            s.session_id in sessions and bool(sessions[s.session_id].pages)))
        still_waiting = collections.deque()
        for seq in ordered:
            if (len(self._in_flight) < self.max_slots
                    and self._table.admit(seq, self.decode_steps)):
                self._in_flight.append(seq)
            else:
                still_waiting.append(seq)
        if still_waiting and not self._in_flight:
            # Nothing in flight will free pages: the pool is held by parked sessions that
            # may not be evicted (deterministic mode). Waiting would hang the caller.
            for seq in still_waiting:
                self._finish(seq, "abort", None, error=(
                    f"JaxEngine: the KV pool ({self.kv_pages} pages of {self.page_size} "
                    f"slots) is held by {len(sessions)} parked sessions, which "
                    f"deterministic mode never evicts; end_session() finished ones or "
                    f"raise kv_pages"))
            still_waiting.clear()
        self._waiting = still_waiting

    def _writable(self, seq: _Sequence, end: int, copies: list) -> bool:
        """Pages for slots [seq.length, end) are the sequence's own (copies queued)."""
        planned = self._table.prepare_writes(seq, end)
        if planned is None:
            return False
        copies.extend(planned)
        return True

    def _copy_pages(self, copies: Sequence[tuple[int, int]]) -> None:
        """Runs the queued copy-on-write page copies (one program: max_slots copies,
        the rest padding)."""
        for start in range(0, max(len(copies), 1), self.max_slots):
            part = copies[start:start + self.max_slots]
            src = np.zeros(self.max_slots, np.int32)
            dst = np.full(self.max_slots, self.kv_pages, np.int32)  # out of range: skipped
            for i, (a, b) in enumerate(part):
                src[i], dst[i] = a, b
            self._cache = copy_pages(self._cache, src, dst)

    def _item_count(self, spans: Sequence[int], rows: int, kind: str) -> int:
        """The attention items of a `kind` call whose rows attend `spans` slots."""
        return self._shapes.items(items_needed(spans, self.page_size, TILES[kind]), rows, kind)

    def _items(self, seqs: Sequence[_Sequence], spans: Sequence[int], rows: int,
               size: int, kind: str) -> AttentionItems | BlockTables:
        if self._kernel_plan is not None:
            k_splits, block_pages, width = self._kernel_plan
            return BlockTables(table=block_table([s.pages for s in seqs], rows, width),
                               k_splits=k_splits, block_pages=block_pages,
                               kernel=self.attention, **self._kernel_mesh)
        pages = [s.pages for s in seqs] + [[]] * (rows - len(seqs))
        spans = list(spans) + [0] * (rows - len(seqs))
        host = build_items(pages, spans, rows, self.page_size, size, TILES[kind])
        return AttentionItems(row=host.row, page=host.page, first_slot=host.first_slot)

    def _flat_slots(self, seq: _Sequence, start: int, stop: int) -> np.ndarray:
        """Flat pool indices (page * page_size + offset) of the sequence's slots
        [start, stop)."""
        size, first = self.page_size, start // self.page_size
        slots = np.arange(start, stop)
        pages = np.asarray(seq.pages[first:-(-stop // size)], np.int64)
        return pages[slots // size - first] * size + slots % size

    def _sampling_arrays(self, work: Sequence[_Row], size: int):
        """Each row's key, the position its first step samples, and its sampling
        parameters."""
        keys = np.zeros((size, 2), np.uint32)
        positions = np.zeros(size, np.int32)
        temperature = np.ones(size, np.float32)
        top_k = np.full(size, -1, np.int32)
        top_p = np.ones(size, np.float32)
        for i, row in enumerate(work):
            keys[i] = row.seq.key
            positions[i] = row.seq.context_length + row.ahead
            temperature[i] = row.seq.sampling.temperature
            top_k[i] = row.seq.sampling.top_k
            top_p[i] = row.seq.sampling.top_p
        return keys, positions, temperature, top_k, top_p

    def _prefill_round(self) -> bool:
        """One prefill call per chunk width in use (per `prefill_rows_per_call`
        sequences), dispatched one after the other and waited for once: the host builds
        a call while the device runs the one before. Returns whether any sequence
        prefilled."""
        shapes, by_width, copies = self._shapes, collections.defaultdict(list), []
        for seq in self._in_flight:
            if not seq.decoding:
                remaining = seq.context_length - 1 - seq.length
                width = shapes.chunk_width(remaining)
                if self._writable(seq, seq.length + min(width, remaining), copies):
                    by_width[width].append(seq)
        if copies:
            self._copy_pages(copies)
        per_call, dispatched, tokens, largest = shapes.prefill_rows_per_call, [], 0, 0
        for width, seqs in sorted(by_width.items()):
            for start in range(0, len(seqs), per_call):
                batch = seqs[start:start + per_call]
                when, count = self._run_prefill(batch, shapes.rows(len(batch), "prefill"),
                                                width)
                dispatched.append(when)
                tokens, largest = tokens + count, max(largest, len(batch))
        if dispatched:
            jax.block_until_ready(self._cache)
            self._count("prefill", dispatched[0], largest, tokens, calls=len(dispatched))
            self._device_done = time.perf_counter()
        return bool(by_width)

    def _run_prefill(self, seqs: Sequence[_Sequence], rows: int, width: int,
                     size: int | None = None) -> tuple[float, int]:
        """Dispatches the prefill of the next (up to) `width` context ids of each sequence
        (row i), without waiting for it; attention items default to the shape for the
        rows' spans. Returns (its dispatch time, its tokens)."""
        tokens = np.zeros((rows, width), np.int32)
        slots = np.full((rows, width), -1, np.int32)
        write = np.full((rows, width), -1, np.int32)
        counts = []
        for row, seq in enumerate(seqs):
            chunk = seq.context(seq.length, min(seq.length + width, seq.context_length - 1))
            end = seq.length + len(chunk)
            tokens[row, :len(chunk)] = chunk
            slots[row, :len(chunk)] = np.arange(seq.length, end)
            write[row, :len(chunk)] = self._flat_slots(seq, seq.length, end)
            counts.append(len(chunk))
        spans = [s.length + n for s, n in zip(seqs, counts)]
        if size is None:
            size = self._item_count(spans, rows, "prefill")
        items = self._items(seqs, spans, rows, size, "prefill")
        dispatched = self._device_call()
        self._cache = prefill(self._weights, self._cache, tokens, slots, write, items)
        for seq, count in zip(seqs, counts):
            seq.length += count
            if seq.decoding:
                self._table.prefilled(seq)
        return dispatched, sum(counts)

    def _decode_round(self) -> bool:
        """Decode calls over every decoding sequence that has pages for its steps. While
        nothing else waits (`_overlap_open`), each call's successor over the rows that go
        on is dispatched before the host reads the call's tokens (module docstring).
        Returns whether any sequence decoded."""
        work, _ = self._decode_work(_Row(seq, 0) for seq in self._in_flight if seq.decoding)
        calls = [self._dispatch_decode(batch) for batch in self._view_batches(work)]
        while calls:
            following = (self._dispatch_following(calls[0])
                         if len(calls) == 1 and self._overlap_open(calls[0]) else None)
            for call in calls:
                self._read_decode(call)
            calls = [following] if following is not None else []
        return bool(work)

    def _decode_work(self, candidates) -> tuple[list[_Row], bool]:
        """The candidates' rows with their steps (a row's `steps` is replaced by its
        budget: tokens left, room left, decode_steps), made writable; rows with no budget
        left are dropped. Returns (rows, whether every row with a budget got pages)."""
        work, copies, complete = [], [], True
        for row in candidates:
            seq = row.seq
            steps = min(seq.sampling.max_new_tokens - len(seq.outputs) - row.ahead,
                        self.max_len - seq.length - row.ahead, self.decode_steps)
            if steps <= 0:
                continue
            if self._writable(seq, row.start + steps, copies):
                work.append(row._replace(steps=steps))
            else:
                complete = False
        if copies:
            self._copy_pages(copies)
        return work, complete

    def _overlap_open(self, call: _DecodeCall) -> bool:
        """Whether `call`'s successor may be dispatched before it is read: overlap is on
        and nothing needs the scheduler between the two (a request or a control message
        to take in, a waiting sequence a free row could admit, a sequence left out of
        `call`, a cancellation). With every row busy, waiting sequences wait either way."""
        admissible = self._waiting and len(self._in_flight) < self.max_slots
        return (self.overlap and not admissible and self._inbox.empty()
                and sum(not row.seq.finished for row in call.rows) == len(self._in_flight)
                and not any(seq.cancelled for seq in self._in_flight))

    def _dispatch_following(self, call: _DecodeCall) -> _DecodeCall | None:
        """The call after `call` (not read yet), over its rows that go on if they emit
        every step: a row that stops early is inactive there by the carry, or (at a stop
        string, found on the host) its tokens are dropped. None when a row lacks pages
        or the rows' pages outgrow one view: the round ends and the scheduler decides."""
        work, complete = self._decode_work(
            _Row(row.seq, 0, row.steps, src) for src, row in enumerate(call.rows)
            if not row.seq.finished)
        if not work or not complete:
            return None
        if len(list(self._view_batches(work))) > 1:
            return None
        self.stats["overlapped_decode_calls"] += 1
        # Done already: the device waited for the host (its work outlasts a call).
        self.stats["host_bound_decode_calls"] += call.outputs[0].is_ready()
        return self._dispatch_decode(work)

    def _view_batches(self, work: list[_Row]):
        """The decode calls of a round, rows in order, split where a call would attend
        more pages than its view may hold (rows sharing a prompt attend its pages each,
        so a round can attend more pages than the pool has)."""
        limit = self._shapes.view_pages
        batch, pages = [], 0
        for row in work:
            need = self._table.pages_for(row.end)
            if batch and limit is not None and pages + need > limit:
                yield batch
                batch, pages = [], 0
            batch.append(row)
            pages += need
        if batch:
            yield batch

    def _dispatch_decode(self, work: list[_Row], rows: int | None = None,
                         size: int | None = None) -> _DecodeCall:
        """Dispatches a decode call over `work` (row i: work[i]) without waiting for it;
        rows and attention items default to the shapes for the work."""
        if rows is None:
            rows = self._shapes.rows(len(work), "decode")
            size = self._item_count([row.end for row in work], rows, "decode")
        lengths = np.zeros(rows, np.int32)
        last = np.zeros(rows, np.int32)
        active = np.zeros(rows, bool)
        budget = np.zeros(rows, np.int32)
        src = np.full(rows, -1, np.int32)
        write = np.full((rows, self.decode_steps), -1, np.int32)
        stop_ids = np.full((rows, self.max_stop_ids), -1, np.int32)
        for i, row in enumerate(work):
            seq = row.seq
            lengths[i] = row.start
            if row.src < 0:
                last[i] = seq.context(seq.length, seq.length + 1)[0]
            src[i] = row.src
            active[i] = True
            budget[i] = row.steps
            write[i, :row.steps] = self._flat_slots(seq, row.start, row.end)
            ids = sorted(seq.stop_ids)
            stop_ids[i, :len(ids)] = ids
        items = self._items([row.seq for row in work], [row.end for row in work], rows,
                            size, "decode")
        keys, positions, temperature, top_k, top_p = self._sampling_arrays(work, rows)
        dispatched = self._device_call()
        self._cache, *outputs, carry = decode(
            self._weights, self._cache, lengths, last, active, write, items, keys,
            positions, budget, stop_ids, temperature, top_k, top_p, self._carry, src,
            num_steps=self.decode_steps)
        # Kept where the next call expects it (one executable whatever produced it).
        self._carry = jax.device_put(carry, self._carry_sharding)
        self._unread += 1
        return _DecodeCall(work, tuple(outputs), dispatched)

    def _read_decode(self, call: _DecodeCall) -> None:
        """Waits for `call` and records its tokens for the sequences still in flight."""
        tokens, logprobs, emitted = call.outputs
        # Python lists: `_record` reads one element per token. A row's emitted steps
        # are a prefix, so their count says which.
        tokens, logprobs = np.asarray(tokens).tolist(), np.asarray(logprobs).tolist()
        counts = np.asarray(emitted).sum(axis=1).tolist()
        # Rows of sequences that finished (at a stop string) after the call was
        # dispatched: their tokens are dropped.
        dropped = sum(n for row, n in zip(call.rows, counts) if row.seq.finished)
        self.stats["dropped_decode_tokens"] += dropped
        # The device ran this call since it was dispatched or the previous one was read.
        busy_from = max(call.dispatched, self._last_read)
        self._unread -= 1
        if call.rows:
            self._count("decode", busy_from, len(call.rows), sum(counts) - dropped)
        self._last_read = time.perf_counter()
        self._device_done = None if self._unread else self._last_read
        for i, (row, count) in enumerate(zip(call.rows, counts)):
            if not row.seq.finished:
                self._record(row.seq, tokens[i][:count], logprobs[i][:count])

    def _resolve_starvation(self) -> None:
        """No sequence in flight could get pages for its next round: free some. Default
        mode preempts the most recent sequence (it prefills its context again when
        pages free up); deterministic mode aborts it (a recomputed context would change
        its later outputs)."""
        seq = self._in_flight[-1]
        if self.deterministic:
            self._finish(seq, "abort", None, error=(
                f"JaxEngine: the KV pool ({self.kv_pages} pages of {self.page_size} slots) "
                f"ran out with {len(self._in_flight)} sequences in flight; raise kv_pages "
                f"or lower max_slots"))
            return
        self.stats["preemptions"] += 1
        seq.meta["preempted"] = seq.meta.get("preempted", 0) + 1
        self._table.truncate(seq, 0)
        self._release(seq)
        self._waiting.appendleft(seq)

    def _device_call(self) -> float:
        """The start of a device call; adds the host time since the device went idle
        (none when a call dispatched earlier is still unread)."""
        now = time.perf_counter()
        if self._device_done is not None:
            self.stats["host_gap_s"] += now - self._device_done
            self._device_done = None
        return now

    def _count(self, program: str, start: float, batch: int, tokens: int,
               calls: int = 1) -> None:
        """Accumulates per-program statistics (calls, seconds since `start`, tokens,
        largest batch)."""
        self.stats[f"{program}_s"] += time.perf_counter() - start
        self.stats[f"{program}_calls"] += calls
        self.stats[f"{program}_tokens"] += tokens
        self.stats[f"max_{program}_batch"] = max(self.stats[f"max_{program}_batch"], batch)
        self.stats["peak_kv_pages"] = self._table.peak_in_use
        # Held pages are a subset of those in use: counted only when that could raise
        # the peak (the count scans the pool).
        if self._table.in_use > self.stats["peak_kv_pages_held"]:
            self.stats["peak_kv_pages_held"] = max(self.stats["peak_kv_pages_held"],
                                                   self._table.held)

    def _record(self, seq: _Sequence, tokens: list[int], logprobs: list[float]) -> None:
        """Records the tokens a decode call sampled for `seq` (in order) up to the first
        that ends it, and finishes it there: a stop id, else a completed stop string,
        else its token budget or max_len. What was sampled after it is dropped, its
        slots left past `seq.length`."""
        room = min(seq.sampling.max_new_tokens - len(seq.outputs),
                   self.max_len + 1 - seq.context_length)
        end = min(len(tokens), room)
        stop = next((i for i, t in enumerate(tokens[:end]) if t in seq.stop_ids), None)
        if stop is not None:
            end = stop + 1
        matched = None
        if seq.stop_strings.stops:
            window = seq.outputs[-seq.stop_strings.window:]
            for i in range(end if stop is None else stop):
                matched = seq.stop_strings.match(window + tokens[:i + 1])
                if matched is not None:
                    end = i + 1
                    break
        seq.outputs += tokens[:end]
        seq.logprobs += logprobs[:end]
        seq.versions += [self.weight_version] * end
        seq.length += end  # the tokens fed are cached now
        if matched is not None:
            self._finish(seq, "stop", matched)
        elif stop is not None:
            self._finish(seq, "stop", tokens[stop])
        elif end == room:
            self._finish(seq, "length", None)

    def _finish(self, seq: _Sequence, reason: str, matched, error: str | None = None) -> None:
        seq.finished = True
        if seq in self._in_flight:
            self._release(seq)
        meta = dict(seq.meta, prompt_tokens=len(seq.input_ids),
                    completion_tokens=len(seq.outputs), weight_version=self.weight_version,
                    logprob_distribution=reported_distribution("sampling", seq.sampling),
                    token_versions=list(seq.versions))
        if error is not None:
            meta["error"] = error
        _resolve(seq, Completion(list(seq.outputs), list(seq.logprobs), reason, matched, meta))

    def _abort_all(self, message: str, details: str | None) -> None:
        seqs = list(self._waiting) + self._in_flight
        self._waiting.clear()
        self._in_flight = []
        self._unread, self._device_done = 0, None
        self._table.clear()
        for seq in seqs:
            seq.pages, seq.length = [], 0
            seq.meta["traceback"] = details
            self._finish(seq, "abort", None, error=message)
        if details is not None:  # buffers may have been donated to the failed call
            self._cache = new_cache(self._weights, self.config, self.kv_pages, self.page_size,
                                    self._cache_dtype, self._key_layout)
            self._carry = jax.device_put(DecodeCarry.empty(self.max_slots),
                                         self._carry_sharding)


def _mark_cancelled(seq: _Sequence, future: asyncio.Future) -> None:
    if future.cancelled():
        seq.cancelled = True


def _resolve(seq: _Sequence, completion: Completion) -> None:
    def set_result():
        if not seq.future.done():
            seq.future.set_result(completion)
    try:
        seq.loop.call_soon_threadsafe(set_result)
    except RuntimeError:  # the caller's event loop is gone
        pass


def resolve_attention(attention: str, platform: str, page_size: int) -> str:
    """The attention path of an engine whose weights are on `platform` ("cpu", "gpu",
    "tpu") with pages of `page_size` slots: "auto" is the Pallas kernel on a GPU (the
    pure-JAX path, with a warning, where this jax cannot compile it or the kernel cannot
    take the page size), else the pure-JAX paged attention. The TPU kernel runs only
    when asked for: no TPU has timed it against the pure-JAX path yet."""
    if attention not in ENGINE_ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ENGINE_ATTENTION))}, "
                         f"got {attention!r}")
    if attention in ("paged", "pallas_tpu"):
        return attention
    if attention == "auto" and platform != "gpu":
        return "paged"
    needs, takes = KERNEL_PAGE_SIZES["pallas_gpu"]
    missing = missing_backend() or (None if takes(page_size) else
                                    f"its page_size must be {needs}, not {page_size}")
    if missing is None:
        return "pallas_gpu"
    if attention == "pallas_gpu":
        raise ValueError(f"attention 'pallas_gpu': {missing}; use 'paged'")
    warnings.warn(f"JaxEngine: the GPU attention kernel cannot run ({missing}); the pure-JAX "
                  f"paged attention runs instead")
    return "paged"


def kernel_plan(attention: str, pages_per_row: int, page_size: int) -> tuple[int, int, int]:
    """(k_splits, pages per compute block, table width) of a Pallas kernel's block tables
    for rows of at most `pages_per_row` pages; refuses a page size it cannot take."""
    if attention == "pallas_tpu":
        return (1, paged_pallas_tpu.tpu_block_pages(page_size),
                paged_pallas_tpu.tpu_table_width(pages_per_row, page_size))
    return paged_pallas.split_plan(pages_per_row, page_size)


def kernel_mesh(cache) -> dict:
    """BlockTables' mesh and kv_head_axis for a pool whose kv heads are sharded over a
    multi-device mesh (`paged_pallas.over_kv_heads`), else {}."""
    sharding = cache.v[0].sharding
    if (not isinstance(sharding, jax.sharding.NamedSharding) or sharding.mesh.size == 1
            or len(sharding.spec) < 2 or sharding.spec[1] is None):
        return {}
    return {"mesh": sharding.mesh, "kv_head_axis": sharding.spec[1]}


def _default_eos_ids(tokenizer, config) -> tuple[int, ...]:
    from agentjax.models.tokenizer import stop_token_ids

    eos = config.eos_token_id
    model_eos = () if eos is None else eos if isinstance(eos, tuple) else (eos,)
    if tokenizer is None:
        return tuple(sorted(set(model_eos)))
    return stop_token_ids(tokenizer, model_eos)

