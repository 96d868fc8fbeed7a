"""Long trajectories: one training step and one log-prob pass at T = 1k ... 32k tokens,
agentjax next to HF transformers (torch, attn_implementation="sdpa", gradient
checkpointing), same weights, same CPU, measured in the same run.

    python scripts/bench/long_context.py                          # T = 1k ... 32k (~1 h)
    python scripts/bench/long_context.py --lengths 2048 8192 --iters 1
    python scripts/bench/long_context.py --attention dense --remat none   # the old path

Model: Qwen2-style, 4 layers, d=256, 8 query heads x 32 (2 kv heads), SwiGLU 1024,
vocab 1024, float32; batch 1 x T, one episode filling the row, loss on every other
token. agentjax runs its defaults (`model.attention="auto"`: dense up to 512 tokens,
blockwise above on CPU; `model.remat="auto"`: every layer recomputed from 4,096 tokens)
unless told otherwise; torch recomputes every layer too (`gradient_checkpointing_enable`).

1. Train step: forward + backward of the masked mean token NLL, gradients w.r.t. every
   parameter (agentjax: jitted `value_and_grad` with `rl.token_logprobs` chunks; torch:
   logits -> cross-entropy -> `.backward()`).
2. Log-prob pass: per-token log-probs of the targets, no backward (what prepare runs for
   the old policy and the reference).

Every (T, side) runs in a process of its own, so its peak RSS (`ru_maxrss`) is its own:
the process builds the model, warms up (JAX compiles ahead of time, timed apart), then
times `--iters` calls of each measurement (scripts/bench/timing.py: best run and spread).
The two sides' processes alternate per T, so slow load lands on one length, not one side.
The ratio is torch's best over agentjax's: above 1, agentjax is faster.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np
from timing import Ratio, Runs, measure, timed  # scripts/bench/timing.py

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--iters", type=int, default=2, help="timed calls per measurement")
    parser.add_argument("--attention", default="auto", help="agentjax model.attention")
    parser.add_argument("--remat", default="auto", help="agentjax model.remat")
    parser.add_argument("--block", type=int, default=256, help="model.attention_block")
    parser.add_argument("--chunk", type=int, default=1024, help="log-prob chunk")
    parser.add_argument("--sides", nargs="+", default=("agentjax", "torch"))
    parser.add_argument("--one", nargs=2, metavar=("SIDE", "T"),
                        help="(internal) measure one side at one length, print JSON")
    return parser.parse_args(argv)


def hf_config():
    import transformers
    return transformers.Qwen2Config(
        vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
        max_position_embeddings=65536, initializer_range=0.1)


def make_batch(length: int):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1024, (1, length))
    targets = np.roll(tokens, -1, axis=1)
    loss_mask = (np.arange(length) % 2 == 1)[None].astype(np.int64)
    loss_mask[:, -1] = 0
    positions = np.arange(length)[None]
    return tokens, positions, targets, loss_mask


def torch_side(folder: str, length: int, args):
    import torch
    import transformers
    model = transformers.Qwen2ForCausalLM.from_pretrained(
        folder, attn_implementation="sdpa", torch_dtype=torch.float32).train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    tokens, positions, targets, loss_mask = (torch.tensor(x) for x in make_batch(length))

    def train_step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens, position_ids=positions).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                reduction="none").view(targets.shape)
        loss = (nll * loss_mask).sum() / loss_mask.sum()
        loss.backward()
        return loss.item()

    def logprobs():
        with torch.inference_mode():
            logits = model(input_ids=tokens, position_ids=positions).logits
            return torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]

    return train_step, logprobs, 0.0, f"torch {torch.__version__} sdpa"


def agentjax_side(folder: str, length: int, args):
    import jax
    import jax.numpy as jnp
    from model import jax_side  # scripts/bench/model.py: the same jitted step and pass

    from agentjax.models.hf import load_hf

    model, _ = load_hf(folder, remat=args.remat, attention=args.attention,
                       attention_block=args.block)
    tokens, positions, targets, loss_mask = make_batch(length)
    # model.py's batch: (tokens, segment ids, positions, targets, loss mask).
    batch = (tokens, jnp.ones_like(jnp.asarray(tokens)), positions, targets, loss_mask)
    train_step, logprobs, compile_seconds = jax_side(model, batch, args.chunk)
    return train_step, logprobs, compile_seconds, (
        f"jax {jax.__version__} attention={args.attention} remat={args.remat}")


def measure_one(side: str, length: int, args) -> dict:
    """One side at one length, in this process: losses, times, peak RSS."""
    import torch
    import transformers
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        transformers.Qwen2ForCausalLM(hf_config()).save_pretrained(folder)
        build = agentjax_side if side == "agentjax" else torch_side
        train_step, logprobs, compile_seconds, version = build(folder, length, args)
    loss = train_step()  # the warm-ups: a 32k step takes minutes, none is wasted
    logprobs()
    runs = measure({"train": timed(train_step), "logprobs": timed(logprobs)}, args.iters,
                   warmup=False)
    return {"side": side, "length": length, "version": version, "loss": loss,
            "compile_s": compile_seconds, "train_s": runs["train"],
            "logprobs_s": runs["logprobs"],
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def run_child(side: str, length: int, args) -> dict | None:
    """`measure_one` in a fresh process; None when it dies (out of memory)."""
    command = [sys.executable, __file__, "--one", side, str(length),
               "--iters", str(args.iters), "--attention", args.attention,
               "--remat", args.remat, "--block", str(args.block), "--chunk", str(args.chunk)]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    if done.returncode:
        print(f"  {side} T={length}: exit {done.returncode}: "
              f"{(done.stderr.strip().splitlines() or [''])[-1][:200]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth(rows: list[dict], side: str) -> str:
    """Peak RSS ratio per doubling of T, from 4k on."""
    sizes = {r["length"]: r["peak_rss_gb"] for r in rows if r and r["side"] == side}
    steps = [f"{sizes[t * 2] / sizes[t]:.2f}" for t in sorted(sizes)
             if t >= 4096 and t * 2 in sizes]
    return ", ".join(steps) or "-"


def main() -> None:
    args = parse_args()
    if args.one:
        side, length = args.one[0], int(args.one[1])
        print(json.dumps(measure_one(side, length, args)))
        return
    print(__doc__.split("\n\n")[2].replace("\n", " "))
    print(f"{'T':>6} {'side':<9} {'step s':>8} {'spread':>7} {'logp s':>8} {'spread':>7} "
          f"{'RSS GB':>7} {'compile':>8}  loss")
    rows, ratios = [], []
    for length in args.lengths:
        results = {side: run_child(side, length, args) for side in args.sides}
        for side, r in results.items():
            if r is None:
                continue
            rows.append(r)
            train, logp = Runs(tuple(r["train_s"])), Runs(tuple(r["logprobs_s"]))
            print(f"{length:>6} {side:<9} {train.best:>8.2f} {train.spread_text():>7} "
                  f"{logp.best:>8.2f} {logp.spread_text():>7} {r['peak_rss_gb']:>7.2f} "
                  f"{r['compile_s']:>8.1f}  {r['loss']:.5f}   ({r['version']})", flush=True)
        ours, theirs = results.get("agentjax"), results.get("torch")
        if ours and theirs:
            ratios.append(
                f"{length:>6}  step {Ratio.of(Runs(tuple(theirs['train_s'])), Runs(tuple(ours['train_s']))).text()}; "
                f"log-probs {Ratio.of(Runs(tuple(theirs['logprobs_s'])), Runs(tuple(ours['logprobs_s']))).text()}; "
                f"RSS {ours['peak_rss_gb'] / theirs['peak_rss_gb']:.2f}x torch's")
    print("\nagentjax against torch (time ratio: torch / agentjax, above 1 agentjax is faster):")
    print("\n".join(ratios))
    for side in args.sides:
        print(f"peak RSS growth per doubling from 4k, {side}: {growth(rows, side)}")


if __name__ == "__main__":
    main()
