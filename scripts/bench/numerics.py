"""Benchmark agentjax.rl numerics against PyTorch baselines measured in the same run.

The baselines are written the way the PyTorch frameworks write them (verl
`trainer/ppo/core_algos.py`): GAE as a reverse Python loop over T, masked PPO / GRPO losses
as eager torch ops with `.backward()`, and token log-probs as full logits followed by
log_softmax + gather (plus the full-logits JAX path, `token_logprobs_full`).

Measurements:
  1. GAE, B=64, T=4096, random interleaved mask: jitted, warm `gae` >= 50x the torch loop;
     `gae_associative` reported beside it.
  2. Masked PPO and GRPO loss forward + backward w.r.t. logp, B=64, T=4096: >= 2x torch.
  3. token_logprobs, N=8192 tokens, d=896, V=151,936 (Qwen2.5-0.5B): peak extra memory
     <= 10% of the full-logits path, values within 1e-5, time within 1.25x (or faster).
     Each path's memory is measured in a fresh subprocess: the peak resident set (VmHWM,
     reset through /proc/self/clear_refs after the inputs are built and the program is
     compiled) minus the resident set at that point, on the first call.

Times (scripts/bench/timing.py): each candidate's best of `--repeats` calls taken in turn
with the others', beside its spread ((max - min) / min); a speedup is printed
only when it exceeds the larger spread of its two rows, and a speedup target with an
unresolved speedup reads UNRESOLVED, not PASS.

Usage:
  python scripts/bench/numerics.py            # the full shapes (needs ~12 GB free RAM)
  python scripts/bench/numerics.py --quick    # small shapes, a smoke run in seconds
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import jax
import numpy as np
import torch
from timing import Ratio, Runs, measure, timed  # scripts/bench/timing.py

from agentjax.rl import advantages, logprobs, losses, policy_losses

SHAPES = {
    "full": dict(gae=(64, 4096), loss=(64, 4096),
                 logprobs=dict(batch=8, seq=1024, hidden=896, vocab=151_936, chunk=32)),
    "quick": dict(gae=(8, 512), loss=(8, 512),
                  logprobs=dict(batch=2, seq=256, hidden=64, vocab=8192, chunk=16)),
}
GAMMA, LAM = 0.99, 0.95
CLIP_LOW, CLIP_HIGH, DUAL_CLIP, KL_COEF = 0.2, 0.28, 3.0, 0.001


def _timed(fns: dict, repeats: int, warmup: bool = True, torch_threads=(None,)) -> dict:
    """Runs (seconds per call) of each blocking fn: `repeats` interleaved calls each
    (timing.measure: load from other processes hits every candidate alike).

    A fn whose name starts with "torch" is measured once per torch intra-op thread count
    in `torch_threads` (None = leave as is) and keeps the runs of its best count: on a
    loaded machine, OpenMP threads spinning for a busy core make small eager torch ops up
    to 30x slower with 2 threads than with 1, and the baseline should not pay for that.
    """
    default_threads = torch.get_num_threads()

    def with_threads(fn, threads):
        def call():
            torch.set_num_threads(threads or default_threads)
            return fn()
        return call

    candidates = {}
    for name, fn in fns.items():
        if name.startswith("torch"):
            candidates.update({(name, threads): timed(with_threads(fn, threads))
                               for threads in torch_threads})
        else:
            candidates[name, None] = timed(fn)
    results = measure(candidates, repeats, warmup=warmup)
    torch.set_num_threads(default_threads)
    return {name: min((Runs(tuple(seconds)) for (of, _), seconds in results.items()
                       if of == name), key=lambda runs: runs.best) for name in fns}


def _token_batch(rng, batch, seq):
    mask = rng.random((batch, seq)) < 0.7  # interleaved action / observation tokens
    return {
        "rewards": rng.standard_normal((batch, seq), dtype=np.float32),
        "values": rng.standard_normal((batch, seq), dtype=np.float32),
        "logp": rng.standard_normal((batch, seq), dtype=np.float32) * 0.5 - 1.0,
        "old_delta": rng.standard_normal((batch, seq), dtype=np.float32) * 0.3,
        "ref_delta": rng.standard_normal((batch, seq), dtype=np.float32) * 0.1,
        "advantages": rng.standard_normal((batch, seq), dtype=np.float32),
        "mask": mask,
    }


# ----------------------------------------------------------------- torch baselines (verl)


def torch_gae(rewards, values, mask, gamma, lam):
    """verl compute_gae_advantage_return: reverse Python loop over T (without whitening)."""
    with torch.no_grad():
        next_values, last_gae_lam, reversed_adv = 0, 0, []
        for t in reversed(range(rewards.shape[-1])):
            delta = rewards[:, t] + gamma * next_values - values[:, t]
            last_gae_lam_ = delta + gamma * lam * last_gae_lam
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae_lam = last_gae_lam_ * mask[:, t] + (1 - mask[:, t]) * last_gae_lam
            reversed_adv.append(last_gae_lam)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        return advantages, advantages + values


def _torch_masked_mean(x, mask):
    return (x * mask).sum() / (mask.sum() + 1e-8)


def _torch_agg(loss_mat, mask, mode):
    if mode == "token-mean":
        return _torch_masked_mean(loss_mat, mask)
    seq_losses = torch.sum(loss_mat * mask, dim=-1) / torch.sum(mask, dim=-1)
    return torch.mean(seq_losses)


def _torch_ppo_token_loss(logp, old_logp, advantages):
    """verl compute_policy_loss_vanilla (clip-higher + dual-clip), per token."""
    negative_approx_kl = torch.clamp(logp - old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * DUAL_CLIP
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


def _torch_k3(logp, ref_logp):
    kl = torch.clamp(ref_logp - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def torch_ppo_loss(logp, old_logp, advantages, mask):
    return _torch_agg(_torch_ppo_token_loss(logp, old_logp, advantages), mask, "token-mean")


def torch_grpo_loss(logp, old_logp, ref_logp, advantages, mask):
    pg = _torch_agg(_torch_ppo_token_loss(logp, old_logp, advantages), mask, "seq-mean-token-mean")
    kl = _torch_agg(_torch_k3(logp, ref_logp), mask, "seq-mean-token-mean")
    return pg + KL_COEF * kl


def torch_full_logprobs(hidden, lm_head, targets):
    """Full [B, T, V] logits, log-softmax + gather, entropy -sum(p log p).

    Written in place (one extra [B, T, V] buffer at a time) so the baseline peaks near two
    logits arrays instead of four; that only makes it a stronger baseline.
    """
    with torch.no_grad():
        logits = hidden @ lm_head
        log_probs = logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))  # log_softmax
        logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -log_probs.exp().mul_(log_probs).sum(dim=-1)
        return logp, entropy


# ----------------------------------------------------------------------- measurements


def bench_gae(shape, repeats):
    data = _token_batch(np.random.default_rng(0), *shape)
    args = (data["rewards"], data["values"], data["mask"])
    scan = jax.jit(lambda r, v, m: advantages.gae(r, v, m, gamma=GAMMA, lam=LAM))
    assoc = jax.jit(lambda r, v, m: advantages.gae_associative(r, v, m, gamma=GAMMA, lam=LAM))
    t_args = [torch.from_numpy(x) for x in args[:2]] + [torch.from_numpy(args[2].astype(np.float32))]
    times = _timed({
        "scan": lambda: jax.block_until_ready(scan(*args)),
        "assoc": lambda: jax.block_until_ready(assoc(*args)),
        "torch": lambda: torch_gae(*t_args, GAMMA, LAM),
    }, repeats, torch_threads=(1, None))
    expected = torch_gae(*t_args, GAMMA, LAM)[0].numpy()
    mask = data["mask"]
    diff = max(float(np.abs(np.asarray(fn(*args)[0]) - expected)[mask].max()) for fn in (scan, assoc))
    return times, diff


def bench_losses(shape, repeats):
    d = _token_batch(np.random.default_rng(1), *shape)
    logp, mask, adv = d["logp"], d["mask"], d["advantages"]
    old_logp, ref_logp = logp - d["old_delta"], logp - d["ref_delta"]

    def ppo(lp):
        return policy_losses.policy_loss(lp, old_logp, adv, mask, kind="ppo", clip_low=CLIP_LOW,
                                         clip_high=CLIP_HIGH, dual_clip=DUAL_CLIP,
                                         agg="token-mean")[0]

    def grpo(lp):  # the trainer's objective with GRPO's knobs
        return losses.rl_objective(lp, old_logp, adv, mask, ref_logp=ref_logp, kind="ppo",
                                   clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL_CLIP,
                                   kl_coef=KL_COEF, agg="seq-mean-token-mean")[0]

    jax_fns = {"ppo": jax.jit(jax.value_and_grad(ppo)), "grpo": jax.jit(jax.value_and_grad(grpo))}
    t = {k: torch.from_numpy(v) for k, v in
         dict(old_logp=old_logp, ref_logp=ref_logp, adv=adv, mask=mask.astype(np.float32)).items()}
    t_logp = torch.from_numpy(logp.copy()).requires_grad_()

    def torch_step(kind):
        t_logp.grad = None
        if kind == "ppo":
            loss = torch_ppo_loss(t_logp, t["old_logp"], t["adv"], t["mask"])
        else:
            loss = torch_grpo_loss(t_logp, t["old_logp"], t["ref_logp"], t["adv"], t["mask"])
        loss.backward()
        return loss.detach(), t_logp.grad

    results = {}
    for kind, fn in jax_fns.items():
        times = _timed({"jax": lambda fn=fn: jax.block_until_ready(fn(logp)),
                        "torch": lambda kind=kind: torch_step(kind)}, repeats,
                       torch_threads=(1, None))
        (loss, grad), (t_loss, t_grad) = fn(logp), torch_step(kind)
        diff = max(abs(float(loss) - float(t_loss)),
                   float(np.abs(np.asarray(grad) - t_grad.numpy())[mask].max()))
        results[kind] = (times, diff)
    return results


def _logprobs_inputs(cfg):
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((cfg["batch"], cfg["seq"], cfg["hidden"]), dtype=np.float32)
    lm_head = rng.standard_normal((cfg["hidden"], cfg["vocab"]), dtype=np.float32)
    lm_head *= 2.0 / np.sqrt(cfg["hidden"])  # logits with std ~2, like a trained lm-head
    targets = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"])).astype(np.int32)
    return hidden, lm_head, targets


def _logprobs_callables(cfg, hidden, lm_head, targets):
    """name -> blocking call returning (logp, entropy) as numpy."""
    chunked = jax.jit(lambda h, w, t: logprobs.token_logprobs(h, w, t, chunk_size=cfg["chunk"]))
    full = jax.jit(logprobs.token_logprobs_full)
    compiled = {"jax_chunked": chunked.lower(hidden, lm_head, targets).compile(),
                "jax_full": full.lower(hidden, lm_head, targets).compile()}
    t_args = (torch.from_numpy(hidden), torch.from_numpy(lm_head),
              torch.from_numpy(targets.astype(np.int64)))
    # Device arrays up front: passing numpy would copy the 0.5 GB lm_head on every call and
    # count that copy as the jax paths' extra memory.
    j_args = jax.block_until_ready(jax.device_put((hidden, lm_head, targets)))
    calls = {name: (lambda c=c: tuple(np.asarray(x) for x in jax.block_until_ready(c(*j_args))))
             for name, c in compiled.items()}
    calls["torch_full"] = lambda: tuple(x.numpy() for x in torch_full_logprobs(*t_args))
    xla_temp = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    return calls, xla_temp


def _rss_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_memory(cfg, path):
    """Fresh process: peak extra resident memory of one first call of `path`."""
    hidden, lm_head, targets = _logprobs_inputs(cfg)
    calls, xla_temp = _logprobs_callables(cfg, hidden, lm_head, targets)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        method = "VmHWM after clear_refs, minus VmRSS"
        baseline = _rss_kib("VmRSS")
        calls[path]()
        extra = _rss_kib("VmHWM") - baseline
    except OSError:  # no clear_refs: ru_maxrss also counts the compilation peak
        method = "ru_maxrss delta"
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        calls[path]()
        extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline
    print(json.dumps({"extra_mib": extra / 1024, "method": method,
                      "xla_temp_mib": xla_temp.get(path, 0) / 2**20}))


def child_time(cfg, repeats):
    """Fresh process: interleaved timings of the three paths and their value differences.

    The jax programs are compiled ahead of time; the first call of each path (also the
    warm-up) provides the values, then `repeats` interleaved calls are timed.
    """
    hidden, lm_head, targets = _logprobs_inputs(cfg)
    calls, _ = _logprobs_callables(cfg, hidden, lm_head, targets)
    outs = {name: call() for name, call in calls.items()}
    times = _timed(calls, repeats, warmup=False)
    diffs = {name: max(float(np.abs(a - b).max()) for a, b in zip(outs["jax_chunked"], out))
             for name, out in outs.items() if name != "jax_chunked"}
    # float64 ground truth on the first 16 tokens, vocabulary in slices to bound memory.
    h64 = hidden.reshape(-1, hidden.shape[-1])[:16].astype(np.float64)
    logits = np.concatenate([h64 @ lm_head[:, i:i + 16384].astype(np.float64)
                             for i in range(0, lm_head.shape[1], 16384)], axis=1)
    lse = logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    logp64 = logits[np.arange(16), targets.reshape(-1)[:16]] - lse
    probs = np.exp(logits - lse[:, None])
    entropy64 = lse - (probs * logits).sum(1)
    for name in ("jax_chunked", "torch_full"):
        logp, entropy = (x.reshape(-1)[:16] for x in outs[name])
        diffs[f"{name}_vs_float64"] = float(max(np.abs(logp - logp64).max(),
                                                np.abs(entropy - entropy64).max()))
    print(json.dumps({"times": {name: runs.costs for name, runs in times.items()},
                      "diffs": diffs}))


def _run_child(args: list[str]) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ report


def _row(name, ours, base, ratio, target, ok):
    return (name, ours, base, ratio, target, "PASS" if ok else "FAIL")


def _time_row(name, ours: Runs, base: Runs, min_speedup):
    """A timing row: best runs with their spreads and the speedup base / ours. A speedup
    target (min_speedup >= 1) needs the speedup resolved (above the noise); a bound
    (min_speedup < 1: "at most 1/min_speedup the time") holds on the best runs."""
    ratio = Ratio.of(base, ours)
    if min_speedup >= 1:
        target = f">= {min_speedup:g}x faster"
    else:
        target = f"<= {1 / min_speedup:.2f}x the time"
    if not ratio.resolved:
        shown = ratio.text()
    elif ratio.value >= 1:
        shown = f"{ratio.value:.1f}x faster"
    else:
        shown = f"{1 / ratio.value:.2f}x the time"
    ok = ratio.value >= min_speedup and (ratio.resolved or min_speedup < 1)
    return (name, _ms(ours), _ms(base), shown, target,
            "PASS" if ok else "FAIL" if ratio.resolved or min_speedup < 1 else "UNRESOLVED")


def _ms(runs: Runs) -> str:
    return f"{runs.best * 1e3:.2f} ms (spread {runs.spread_text()})"


def _print_table(rows):
    header = ("measurement", "agentjax", "baseline", "ratio", "target", "result")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per candidate")
    parser.add_argument("--skip-logprobs", action="store_true",
                        help="skip measurement 3 (the full-size one needs ~12 GB of RAM)")
    parser.add_argument("--child", choices=["memory", "time"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = SHAPES["quick" if args.quick else "full"]

    if args.child == "memory":
        return child_memory(shapes["logprobs"], args.path)
    if args.child == "time":
        return child_time(shapes["logprobs"], args.repeats or 3)

    load = os.getloadavg()
    print(f"agentjax rl numerics benchmark ({'quick' if args.quick else 'full'} shapes); "
          f"jax {jax.__version__} on {jax.default_backend()}, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f}; times are the best of interleaved repeats (shared machine), torch "
          f"at its better of 1 and {torch.get_num_threads()} threads for measurements 1-2")
    if args.quick:
        print("quick shapes: a smoke run; fixed per-call overheads dominate, so the targets "
              "(set for the full shapes) are indicative only")
    rows = []

    gae_times, gae_diff = bench_gae(shapes["gae"], args.repeats or 10)
    b, t = shapes["gae"]
    rows.append(_time_row(f"gae (lax.scan) B={b} T={t} vs torch loop", gae_times["scan"],
                          gae_times["torch"], 50))
    rows.append(_row(f"gae_associative B={b} T={t} vs torch loop",
                     _ms(gae_times["assoc"]), _ms(gae_times["torch"]),
                     Ratio.of(gae_times["torch"], gae_times["assoc"]).text(1), "reported",
                     True))
    rows.append(_row("gae max |agentjax - torch| on action tokens", f"{gae_diff:.1e}", "-", "-",
                     "<= 1e-4", gae_diff <= 1e-4))

    b, t = shapes["loss"]
    for kind, (times, diff) in bench_losses(shapes["loss"], args.repeats or 10).items():
        rows.append(_time_row(f"{kind} loss fwd+bwd wrt logp B={b} T={t} vs torch", times["jax"],
                              times["torch"], 2))
        rows.append(_row(f"{kind} loss+grad max |agentjax - torch|", f"{diff:.1e}", "-", "-",
                         "<= 1e-5", diff <= 1e-5))

    if not args.skip_logprobs:
        cfg = shapes["logprobs"]
        quick = ["--quick"] if args.quick else []
        mem = {p: _run_child([*quick, "--child", "memory", "--path", p])
               for p in ("jax_chunked", "jax_full", "torch_full")}
        timing = _run_child([*quick, "--child", "time", "--repeats", str(args.repeats or 3)])
        n = cfg["batch"] * cfg["seq"]
        label = f"token_logprobs N={n} d={cfg['hidden']} V={cfg['vocab']} chunk={cfg['chunk']}"
        ours = mem["jax_chunked"]["extra_mib"]
        for base in ("jax_full", "torch_full"):
            base_mib = mem[base]["extra_mib"]
            fraction = ours / base_mib
            rows.append(_row(f"{label} peak extra memory vs {base}", f"{ours:.0f} MiB",
                             f"{base_mib:.0f} MiB", f"{fraction:.3f}x", "<= 0.10x",
                             fraction <= 0.10))
        for base in ("jax_full", "torch_full"):
            times = {name: Runs(tuple(costs)) for name, costs in timing["times"].items()}
            rows.append(_time_row(f"{label} time vs {base}", times["jax_chunked"],
                                  times[base], 0.8))
        diffs = timing["diffs"]
        for base in ("jax_full", "float64"):
            diff = diffs["jax_chunked_vs_float64" if base == "float64" else base]
            rows.append(_row(f"token_logprobs max |chunked - {base}| (logp, entropy)",
                             f"{diff:.1e}", "-", "-", "<= 1e-5", diff <= 1e-5))
        # torch's own float32 rounding differs from XLA's; shown beside its float64 error.
        rows.append(_row("token_logprobs max |chunked - torch_full| (logp, entropy)",
                         f"{diffs['torch_full']:.1e}", "-", "-",
                         f"reported (torch vs float64: {diffs['torch_full_vs_float64']:.1e})",
                         True))
        print(f"memory method: {mem['jax_chunked']['method']}, each path in a fresh subprocess, "
              f"first call after compilation; XLA temp buffers: "
              + ", ".join(f"{p} {m['xla_temp_mib']:.0f} MiB" for p, m in mem.items()
                          if p.startswith("jax")))
    _print_table(rows)
    return 0 if all(r[-1] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
