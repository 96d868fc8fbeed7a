"""Benchmark the agentjax decoder against transformers' torch model, same weights, same
CPU, measured in the same run.

    python scripts/bench/model.py                       # the size below (a few minutes)
    python scripts/bench/model.py --layers 2 --seq 128  # quicker

Config: Qwen2-style, 4 layers, d=256, 4 heads x 64 (2 KV heads), SwiGLU 1024,
vocab 8192, batch 8 x seq 512, float32, left-padded rows (lengths in [seq/2, seq]).

1. Train step: forward + backward of the masked mean token NLL, gradients w.r.t. every
   parameter. agentjax: one jitted `value_and_grad` over the params pytree with log-probs
   from `rl.token_logprobs` (hidden states x lm-head, chunked); torch: eager
   `model(...).logits` -> cross-entropy -> `.backward()`.
2. Log-prob forward: per-token log-probs of the targets. agentjax: jitted decoder +
   `rl.token_logprobs`; torch: `torch.inference_mode()` logits -> log_softmax -> gather.

JAX compile time (ahead-of-time `lower().compile()`) is printed separately. After one
warm-up call per side, the two sides' `--iters` calls take turns (scripts/bench/timing.py:
load from other processes hits both alike); each side reports its best call and the
spread of its calls ((max - min) / min), and the ratio is printed only when it
exceeds the larger spread. torch uses its default intra-op threads, XLA its default CPU
thread pool.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from timing import Ratio, Runs, measure, timed  # scripts/bench/timing.py

from agentjax.models.hf import load_hf
from agentjax.rl.logprobs import token_logprobs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--mlp", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=128, help="token_logprobs chunk size")
    parser.add_argument("--iters", type=int, default=5)
    return parser.parse_args()


def make_batch(args, rng):
    tokens = rng.integers(0, args.vocab, (args.batch, args.seq))
    lengths = rng.integers(args.seq // 2, args.seq + 1, args.batch)
    mask = (np.arange(args.seq)[None] >= args.seq - lengths[:, None]).astype(np.int64)
    positions = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    # Loss on next-token targets of real tokens (target = next token, last one dropped).
    loss_mask = np.zeros_like(mask)
    loss_mask[:, :-1] = mask[:, :-1] * mask[:, 1:]
    targets = np.roll(tokens, -1, axis=1)
    return tokens, mask, positions, targets, loss_mask


def torch_side(model, batch):
    import torch

    tokens, mask, positions, targets, loss_mask = (torch.tensor(x) for x in batch)
    params = [p for p in model.parameters()]

    def train_step():
        for p in params:
            p.grad = None
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=positions).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                reduction="none").view(targets.shape)
        loss = (nll * loss_mask).sum() / loss_mask.sum()
        loss.backward()
        return loss.item()

    def logprobs():
        with torch.inference_mode():
            logits = model(input_ids=tokens, attention_mask=mask, position_ids=positions).logits
            return torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0].numpy()

    return train_step, logprobs


def jax_side(model, batch, chunk: int, *, with_logprobs: bool = True):
    """(train step, log-prob pass or None without `with_logprobs`, compile seconds) of
    the agentjax model on `batch`, each a no-argument call."""
    tokens, mask, positions, targets, loss_mask = (jnp.asarray(x, jnp.int32) for x in batch)
    graphdef, params = nnx.split(model)

    def logp_fn(params):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(tokens, positions, mask)
        logp, _ = token_logprobs(hidden, model.lm_head_weight(), targets, chunk_size=chunk)
        return logp

    def loss_fn(params):
        return -(logp_fn(params) * loss_mask).sum() / loss_mask.sum()

    # Compiled ahead of time so compilation is timed on its own.
    start = time.perf_counter()
    grad_step = jax.jit(jax.value_and_grad(loss_fn)).lower(params).compile()
    logp_step = jax.jit(logp_fn).lower(params).compile() if with_logprobs else None
    compile_seconds = time.perf_counter() - start

    def train_step():
        loss, grads = grad_step(params)
        jax.block_until_ready(grads)
        return float(loss)

    def logprobs():
        return np.asarray(logp_step(params))

    return train_step, logprobs if with_logprobs else None, compile_seconds


def main() -> None:
    # torch only here and in torch_side: device.py imports jax_side on accelerator
    # hosts that may have no torch.
    import torch
    import transformers

    args = parse_args()
    config = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, tie_word_embeddings=False,
        initializer_range=0.1)  # peakier outputs than 0.02 make the agreement check bite
    torch.manual_seed(0)
    torch_model = transformers.Qwen2ForCausalLM(config).float().train()
    with tempfile.TemporaryDirectory() as path:
        torch_model.save_pretrained(path)
        jax_model, _ = load_hf(path)
    batch = make_batch(args, np.random.default_rng(0))
    tokens_per_step = args.batch * args.seq
    n_params = sum(p.numel() for p in torch_model.parameters())

    jax_train, jax_logp, compile_seconds = jax_side(jax_model, batch, args.chunk)
    torch_train, torch_logp = torch_side(torch_model, batch)
    jax_loss, torch_loss = jax_train(), torch_train()
    logp_gap = np.abs(jax_logp() - torch_logp())[batch[4] != 0].max()

    print(f"agentjax vs transformers {transformers.__version__} (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads), jax {jax.__version__} on "
          f"{jax.devices()[0].platform}")
    print(f"model: {args.layers} layers, d={args.hidden}, {args.heads}x{args.hidden // args.heads} "
          f"heads ({args.kv_heads} kv), mlp {args.mlp}, vocab {args.vocab}, "
          f"{n_params / 1e6:.1f}M params, float32; batch {args.batch} x {args.seq} "
          f"(left padded); token_logprobs chunk {args.chunk}")
    print(f"agreement: loss {jax_loss:.6f} vs {torch_loss:.6f}, max |log-prob diff| over "
          f"loss tokens = {logp_gap:.1e}")
    print(f"jax compile (train step + log-prob forward, ahead of time): {compile_seconds:.2f} s")
    print(f"{'measurement':<22} {'agentjax tok/s':>15} {'spread':>7} {'torch tok/s':>12} "
          f"{'spread':>7}  ratio (best of {args.iters} interleaved calls)")
    for name, jax_fn, torch_fn in [("train step (fwd+bwd)", jax_train, torch_train),
                                   ("log-prob forward", jax_logp, torch_logp)]:
        # The agreement checks above were each side's warm-up call.
        runs = measure({"jax": timed(jax_fn), "torch": timed(torch_fn)}, args.iters,
                       warmup=False)
        ours, theirs = (Runs(tuple(seconds)) for seconds in runs.values())
        print(f"{name:<22} {tokens_per_step / ours.best:>15.0f} {ours.spread_text():>7} "
              f"{tokens_per_step / theirs.best:>12.0f} {theirs.spread_text():>7}  "
              f"{Ratio.of(theirs, ours).text()}")

if __name__ == "__main__":
    main()
