"""Where a GRPO update's time goes on CPU at configs/real_python.py's shapes: the same
episodes trained as rows padded to rollout.max_tokens or packed into micro-batches of
algo.micro_tokens, in float32 or bfloat16, with or without remat, the extra forward an
old-log-prob recompute or a KL reference costs, and the lm-head run at the loss's
positions only (model.logprob_positions) against every position.

    python scripts/bench/real_step.py                  # 4 of SmolLM2-135M's 30 layers
    python scripts/bench/real_step.py --layers 30      # the whole model (slow)
    python scripts/bench/real_step.py --only "packed micro,lm-head"   # some candidates

The model is SmolLM2-135M-Instruct's config (576 wide, 9 heads, 3 kv heads, MLP 1536,
vocab 49,152, tied) with `--layers` layers and random weights (the time does not depend
on the values). A step's batch: `--episodes` episodes of `--length` tokens of which
`--action_frac` are the agent's (the loss mask; the rest is prompt and tool output).
Every candidate is compiled ahead of time (its compile seconds printed), run once
untimed, then the candidates take turns (scripts/bench/timing.py); each prints its best
run for the whole batch and the ratio to the baseline, the recipe's setting before this
bench (rows padded to 512, float32, no remat, old log-probs recomputed).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from timing import Ratio, Runs, measure  # scripts/bench/timing.py

from agentjax.models import Decoder, ModelConfig
from agentjax.rl.logprobs import masked_token_logprobs, token_logprobs

SMOLLM2 = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
               intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
               head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
               rope_theta=100000.0, tie_word_embeddings=True, vocab_size=49152)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=16, help="a step's episodes")
    parser.add_argument("--length", type=int, default=350, help="tokens an episode")
    parser.add_argument("--action_frac", type=float, default=0.15)
    parser.add_argument("--max_tokens", type=int, default=512, help="rollout.max_tokens")
    parser.add_argument("--micro_tokens", type=int, default=2048, help="algo.micro_tokens")
    parser.add_argument("--chunk", type=int, default=512, help="model.logprob_chunk")
    parser.add_argument("--head_positions", type=float, default=0.25,
                        help="model.logprob_positions of the lm-head candidates")
    parser.add_argument("--only", default="", help="comma-separated words: run the "
                        "candidates whose name holds one (the baseline always runs)")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def batch(rows: int, seq: int, episodes_per_row: int, length: int, action_frac: float):
    """tokens, positions, segment ids and loss mask of `rows` rows of `seq` tokens, each
    holding `episodes_per_row` episodes of `length` tokens (the rest padding)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SMOLLM2["vocab_size"], (rows, seq))
    segments = np.zeros((rows, seq), np.int64)
    positions = np.zeros((rows, seq), np.int64)
    loss = np.zeros((rows, seq), np.float32)
    actions = int(action_frac * length)
    for e in range(episodes_per_row):
        span = slice(e * length, (e + 1) * length)
        segments[:, span] = e + 1
        positions[:, span] = np.arange(length)
        loss[:, (e + 1) * length - actions:(e + 1) * length] = 1.0
    return tuple(jnp.asarray(x, jnp.float32 if x is loss else jnp.int32)
                 for x in (tokens, positions, segments, loss))


def step(model_config: ModelConfig, data, chunk: int, *, train: bool,
         head_positions: float = 1.0):
    """(one compiled call, its compile seconds): the forward-backward of the masked
    log-prob loss (`train`) or the log-prob forward alone; `head_positions` < 1: the
    lm-head at the loss positions only, up to that share of a row
    (model.logprob_positions)."""
    graphdef, params = nnx.split(Decoder(model_config, rngs=nnx.Rngs(0)))
    tokens, positions, segments, loss = data

    def logp(params):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(tokens, positions, segments)
        targets = jnp.roll(tokens, -1, 1)
        if head_positions < 1:
            return masked_token_logprobs(
                hidden, model.lm_head_weight(), targets, loss, chunk_size=chunk,
                positions=math.ceil(head_positions * tokens.shape[1]))[0]
        return token_logprobs(hidden, model.lm_head_weight(), targets, chunk_size=chunk)[0]

    def objective(params):
        return -(logp(params) * loss).sum()

    fn = jax.value_and_grad(objective) if train else logp
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(params).compile()
    seconds = time.perf_counter() - start
    return (lambda: jax.block_until_ready(compiled(params))), seconds


def main() -> None:
    args = parse_args()
    base = ModelConfig.from_hf(dict(SMOLLM2, num_hidden_layers=args.layers))
    base = dataclasses.replace(base, remat="none")
    per_row = args.micro_tokens // args.length
    micro = math.ceil(args.episodes / per_row)
    padded = batch(args.episodes, args.max_tokens, 1, args.length, args.action_frac)
    packed = batch(1, args.micro_tokens, per_row, args.length, args.action_frac)
    head = {"head_positions": args.head_positions}
    cases = {  # name -> (model config, batch, calls a step makes, train?, step options)
        "padded rows, float32 (baseline)": (base, padded, 1, True, {}),
        "packed micro-batches, float32": (base, packed, micro, True, {}),
        "packed, lm-head at the loss positions": (base, packed, micro, True, head),
        "padded, lm-head at the loss positions": (base, padded, 1, True, head),
        "packed, bfloat16": (dataclasses.replace(base, dtype="bfloat16"), packed, micro, True,
                             {}),
        "packed, remat full": (dataclasses.replace(base, remat="full"), packed, micro, True,
                               {}),
        "one more log-prob forward, packed": (base, packed, micro, False, {}),
    }
    cases = {name: case for name, case in cases.items()
             if "baseline" in name or not args.only
             or any(word in name for word in args.only.split(","))}
    calls, compile_s = {}, {}
    for name, (cfg, data, count, train, options) in cases.items():
        call, compile_s[name] = step(cfg, data, args.chunk, train=train, **options)
        calls[name] = (lambda call=call, count=count: _seconds(call, count))
    print(f"SmolLM2 widths, {args.layers} layers; {args.episodes} episodes of {args.length} "
          f"tokens ({args.action_frac:.0%} trained): {args.episodes} rows of "
          f"{args.max_tokens} padded, or {micro} micro-batches of {args.micro_tokens}; "
          f"{jax.devices()[0].device_kind}")
    runs = {name: Runs(tuple(r)) for name, r in measure(calls, args.repeats).items()}
    baseline = runs["padded rows, float32 (baseline)"]
    for name, r in runs.items():
        print(f"  {name:38s} {r.best:7.2f} s (spread {r.spread_text()}), compile "
              f"{compile_s[name]:5.1f} s, x{Ratio.of(r, baseline).text()} of the baseline")
    scale = 30 / args.layers
    print(f"  (the layers' share scales by {scale:.1f} to the 30-layer model; the lm-head's "
          "does not)")


def _seconds(call, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        call()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
