"""JaxEngine: the in-process rollout engine (continuous batching over a paged KV cache).

    engine = JaxEngine.from_model(model, tokenizer=tok, max_slots=32, max_len=1024)
    [[completion]] = await engine.generate([GenerateRequest(ids, SamplingParams(...))])
    engine.update_weights(new_params, version=3)     # in place, no recompilation

The engine takes requests in the caller's thread (checks, one `SequenceState` per
sample, its sampling key) and hands them to its parts, one concept each:

- `scheduler.py`: the scheduler thread, its inbox and queues, admission, preemption,
  weight swaps between rounds;
- `rounds.py`: prefill and decode rounds (which sequences share a call, overlap);
- `calls.py`: each device call's host arrays and dispatch; `programs.py` the jitted
  programs; `shapes.py` their shapes; `attention.py` the attention path;
- `pages.py`: the page table, sessions and shared contexts;
- `sequences.py`: one completion being produced; `weights.py` the engine's copy of the
  weights; `stats.py` its counters.

Why the seams are where they are, the batch-invariant mode and the overlap scheduler:
docs/design.md, "The engine: scheduler, page table, device programs".
"""
from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any, Sequence

import jax
from flax import nnx

from agentjax.engine.jax.attention import resolve_attention
from agentjax.engine.jax.calls import DeviceCalls
from agentjax.engine.jax.pages import PageTable
from agentjax.engine.jax.programs import COMPILE_COUNTS
from agentjax.engine.jax.rounds import Rounds
from agentjax.engine.jax.sampling import fold_in_data, prng_key_data
from agentjax.engine.jax.scheduler import Scheduler
from agentjax.engine.jax.sequences import SequenceState, StopStrings
from agentjax.engine.jax.shapes import default_kv_pages, engine_shapes
from agentjax.engine.jax.stats import EngineStats
from agentjax.engine.jax.weights import WeightLoader
from agentjax.engine.protocol import Completion, GenerateRequest, check_request
from agentjax.models.paged import page_bytes


class JaxEngine:
    """In-process batched sampler implementing the Engine protocol (docs/design.md).

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
      deterministic: batch-invariant mode (docs/design.md): a seeded request's output
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
        device runs the next (docs/design.md). Outputs are the same either way in
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
        self._loader = WeightLoader(graphdef, params)
        weights = self._loader.load(params)
        self.config = weights.config
        self.tokenizer = tokenizer
        self.max_slots, self.max_len = max_slots, max_len
        self.deterministic = deterministic
        self.deterministic_prefill_rows = deterministic_prefill_rows
        self.decode_steps = decode_steps
        self.attention = resolve_attention(
            attention, next(iter(jax.tree.leaves(weights)[0].devices())).platform, page_size)
        self.page_size = page_size
        self.kv_pages = (default_kv_pages(max_slots, max_len, page_size) if kv_pages is None
                         else kv_pages)
        if self.kv_pages < 1:
            raise ValueError(f"kv_pages must be positive, got {kv_pages}")
        # A decode call's view holds at most the pool's page count (docs/design.md).
        self._shapes = engine_shapes(
            max_slots=max_slots, max_len=max_len, page_size=page_size,
            kv_pages=self.kv_pages, prefill_chunks=prefill_chunks,
            batch_buckets=batch_buckets, deterministic=deterministic,
            deterministic_prefill_rows=deterministic_prefill_rows,
            block_tables=self.attention != "paged")
        self.batch_wait_s = batch_wait_s
        self.max_stop_ids = max_stop_ids
        if eos_token_ids is None:
            eos_token_ids = _default_eos_ids(tokenizer, self.config)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        cache_dtype = self.config.dtype if cache_dtype is None else cache_dtype
        self.stats = collections.Counter()
        self.stats["kv_page_bytes"] = page_bytes(self.config, page_size, cache_dtype)
        # Shared contexts are reclaimed when pages run out; the count bound only caps the
        # host memory of their keys. A GRPO group's siblings may start a turn apart (as
        # rows free up), so a sync RL step's contexts (episodes x turns) should all fit.
        table = PageTable(self.kv_pages, page_size, evict_parked=not deterministic,
                          stats=self.stats, max_contexts=8 * max_slots)
        stats = EngineStats(self.stats, table)
        self._device = DeviceCalls(
            weights, self._shapes, attention=self.attention, kv_pages=self.kv_pages,
            cache_dtype=cache_dtype, decode_steps=decode_steps, max_stop_ids=max_stop_ids,
            stats=stats)
        self._rounds = Rounds(self._device, table, stats, self._shapes, max_len=max_len,
                              decode_steps=decode_steps, overlap=overlap)
        self._base_key = prng_key_data(seed)
        self._unseeded = itertools.count()
        self._scheduler = Scheduler(
            self._rounds, self._device, table, stats, max_slots=max_slots, max_len=max_len,
            decode_steps=decode_steps, batch_wait_s=batch_wait_s, deterministic=deterministic)

    @classmethod
    def from_model(cls, model: nnx.Module, **kwargs) -> "JaxEngine":
        """Builds an engine from a Decoder (`nnx.split` is applied); kwargs as __init__."""
        graphdef, params = nnx.split(model)
        return cls(graphdef, params, **kwargs)

    @property
    def weight_version(self) -> int:
        """Version of the params in use (see `update_weights`)."""
        return self._scheduler.weight_version

    @property
    def overlap(self) -> bool:
        """Whether decode calls overlap the host's work (read between decode calls: set it
        while the engine is idle)."""
        return self._rounds.overlap

    @overlap.setter
    def overlap(self, value: bool) -> None:
        self._rounds.overlap = value

    # ---------------------------------------------------------------- Engine protocol

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Samples every request; returns its `n` completions per request, in order.

        Raises ValueError (naming the request) for invalid sampling parameters or ids;
        a request that does not fit the cache comes back with finish_reason "abort".
        """
        if self._scheduler.stopped:
            raise RuntimeError("JaxEngine is closed")
        loop = asyncio.get_running_loop()
        per_request = []
        for index, request in enumerate(requests):
            self._validate(index, request)
            per_request.append([self._make_sequence(request, i, loop)
                                for i in range(request.sampling.n)])
        for seqs in per_request:
            for seq in seqs:
                self._scheduler.submit(seq)
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
        dropped (`engine/jax/scheduler.py`). No recompilation.

        Args:
          weights: params with the structure of `nnx.split(model)[1]`.
          version: recorded as `meta["weight_version"]` (default: previous + 1).
        """
        self._scheduler.call("weights", (self._loader.load(weights), version))

    def health(self) -> bool:
        """True while the scheduler thread runs."""
        return self._scheduler.running

    def end_session(self, session_id: str) -> None:
        """Frees the session's pages (asynchronously, in the scheduler thread)."""
        self._scheduler.end_session(session_id)

    # ---------------------------------------------------------------- public extras

    def warmup(self) -> int:
        """Compiles every program the engine can call (`ProgramShapes.programs`) with
        inert inputs, so later requests never wait on XLA; returns the number of programs.
        Safe while requests run."""
        self._scheduler.call("warmup", None)
        return len(self._shapes.programs())

    @property
    def compile_counts(self) -> dict[str, int]:
        """XLA compilations of the engine's programs so far, process-wide."""
        return dict(COMPILE_COUNTS)

    def close(self) -> None:
        """Stops the scheduler thread; in-flight requests are aborted."""
        self._scheduler.stop()

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

    def _make_sequence(self, request: GenerateRequest, sample_index: int,
                       loop) -> SequenceState:
        """Sample `sample_index` of the request. Its key is `fold_in(PRNGKey(seed),
        sample_index)`, or drawn from the engine's stream when `seed` is None."""
        s = request.sampling
        if s.seed is None:
            base = fold_in_data(self._base_key, next(self._unseeded))
        else:
            base = fold_in_data(prng_key_data(s.seed), sample_index)
        return SequenceState(
            input_ids=tuple(map(int, request.input_ids)), sampling=s,
            session_id=request.session_id, key=base,
            stop_ids=frozenset(s.stop_token_ids) | frozenset(self.eos_token_ids),
            stop_strings=StopStrings(self.tokenizer, s.stop),
            future=loop.create_future(), loop=loop)


def _default_eos_ids(tokenizer, config) -> tuple[int, ...]:
    from agentjax.models.tokenizer import stop_token_ids

    eos = config.eos_token_id
    model_eos = () if eos is None else eos if isinstance(eos, tuple) else (eos,)
    if tokenizer is None:
        return tuple(sorted(set(model_eos)))
    return stop_token_ids(tokenizer, model_eos)
