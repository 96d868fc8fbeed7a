"""agentjax against TRL's GRPOTrainer: the same model, tasks, prompts, group size, batch,
new-token budget, learning rate, loss and steps, on CPU, in one run.

    python scripts/bench/vs_trl.py --model /models/smollm2-hf [--prompts 2] [--group 4]
        [--max_new_tokens 64] [--steps 3] [--microbatch 1] [--max_tokens 512] [--lr 1e-6]
        [--seed 0] [--threads 2] [--nice 0] [--out runs/vs_trl] [-- --config.key=value ...]
    python scripts/bench/vs_trl.py --tiny --model TINY_HF_FOLDER --out /tmp/vs_trl

Each side runs in its own process, one after the other, pinned to the same CPUs
(--threads of them: torch.set_num_threads and OMP/MKL for TRL, XLA's thread pool follows
the CPU affinity for agentjax) at the same nice level; its peak resident memory is that
process's ru_maxrss (os.wait4). agentjax runs first, through its normal entry:
scripts/train.py on configs/grpo_python.py (variant cpu; test with --tiny) with the
overrides below (and any after `--`); its seconds per step, rollout and update come from
its own metrics.jsonl (time/rollout_s, time/update_s; the update includes the weight
push to the engine), and the tasks of each step from its trained_groups.jsonl. TRL then
trains on exactly those tasks in that order (shuffle_dataset=False); its rollout is the
time in GRPOTrainer._generate_and_score_completions (generation with transformers, the
reward, the advantages) and its update the rest of the optimizer step (on_step_begin to
on_step_end).

The task is the single-turn part of agentjax's python-tool arithmetic
(agentjax/envs/python: "What is 4821 * 307 - 5515?"), not the multi-turn tool loop:
env.max_turns=1, so an episode is one assistant turn and its reward is agentjax's exact
match of the `<answer>` (a tool call made on that turn is not run). TRL's tool loop
(GRPOTrainer(tools=...)) cannot run the same episodes: it needs a chat template that
renders `tool_calls` and tool messages and a response parser for it (TRL knows Qwen,
Llama 3, GLM, GPT-OSS, ... templates; SmolLM2's renders neither: the output says what
TRL's own checks report for the model's template), and it has no `<answer>` ending nor
agentjax's corrections. Both sides see the same prompt, the python env's system and user
messages rendered by the model's chat template (the run checks the text of agentjax's
first sampled prompt against TRL's rendering), and both are scored by agentjax's reward:
TRL's reward function sends each completion's token ids to a helper process that decodes
them as agentjax's agent loop does and returns suite.rewards(task, env.log) of the
python env (a separate process so that TRL's peak memory does not hold jax).

The same update on both sides: GRPO advantages (reward - group mean) / group std
(unbiased std; TRL scale_rewards="group"), the PPO-clipped ratio with eps 0.2 both ways
(TRL epsilon=epsilon_high=0.2), token losses averaged per sequence then over sequences
(agentjax algo.agg="seq-mean-token-mean", TRL loss_type="grpo"), no KL (kl_coef 0, TRL
beta=0), one optimizer update per rollout batch, its gradient accumulated over
micro-batches of --microbatch sequences (algo.minibatches=1, algo.microbatch_size; TRL
per_device_train_batch_size = microbatch, gradient_accumulation_steps = prompts x group /
microbatch, num_iterations=1), AdamW b1 0.9, b2 0.99, no weight decay, grad-norm clip 1.0, constant
lr, sampling at temperature 1 with no top-p / top-k cut, float32 compute and no
activation recomputation on both (TRL's defaults would be bf16 autocast and gradient
checkpointing). What differs and cannot be matched: agentjax's engine stops a turn at the
env's stop strings (`</answer>`, `</tool_call>`) as well as at end of turn, TRL's
transformers generation only at end of turn (its generate gets no tokenizer, so no stop
strings): the generated tokens per step are printed for each side; agentjax weights the
policy gradient by the truncated engine/trainer IS ratio (algo.tis_cap 2, ~1 on CPU)
and TRL has no such term without vLLM.

Printed (and written to <out>/vs_trl.md): per side the mean seconds per step, rollout
and update over steps 2..N (step 1 holds agentjax's compilations, shown apart), steps
per hour over steps 2..N and over all N steps, generated tokens per step and per second
of rollout, peak RSS, the process's wall time, and the mean reward of each step; then
agentjax / TRL for steps per hour (with timing.Ratio's verdict on the best steps against
their spread) and for memory, and the goal: agentjax >= 2x TRL's steps per hour at <= 1x
its memory, its mean reward no lower than TRL's by more than two standard errors.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from timing import Ratio, Runs

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train.py"
CONFIG = ROOT / "configs" / "grpo_python.py"
GOAL_SPEEDUP, GOAL_MEMORY = 2.0, 1.0


# ----------------------------------------------------------------------------- processes


def measured_process(argv: list[str], log: Path, *, cpus: set[int], nice: int,
                     threads: int, env: dict | None = None) -> dict:
    """Runs `argv` to the end on `cpus` at `nice` (stdout and stderr into `log`);
    returns its peak RSS in GiB, wall seconds and the machine's 1-minute load average
    at its start and end (other work on a shared machine). Fails loudly with the log's
    tail."""
    env = {**(env or os.environ), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}

    def pin():
        os.sched_setaffinity(0, cpus)
        os.nice(nice)

    started, load = time.perf_counter(), os.getloadavg()[0]
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=env, preexec_fn=pin)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if status:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"{' '.join(argv)} failed (status {status}); {log} ends:\n{tail}")
    return {"peak_gib": usage.ru_maxrss / 2**20, "wall_s": wall,
            "load": (load, os.getloadavg()[0])}


def agentjax_overrides(args) -> list[str]:
    """scripts/train.py's overrides: the bench's shared settings (module docstring)."""
    b = args.prompts
    values = {
        "model.path": args.model, "tokenizer.vocab_size": 0, "seed": args.seed,
        "pretrain.steps": 0, "sft.steps": 0, "data.rl_excludes_demo_tasks": False,
        "env.max_turns": 1, "total_steps": args.steps,
        "rollout.prompts_per_step": b, "rollout.group_size": args.group,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_tokens": args.max_tokens,
        # The engine holds this step's episodes and no more (its KV pages are sized by it).
        "rollout.engine_slots": b * args.group, "rollout.concurrency": b * args.group,
        "rollout.temperature": 1.0, "rollout.final_temperature": 1.0,
        "rollout.top_p": 1.0, "rollout.top_k": -1,
        "algo.name": "grpo", "algo.advantage": "grpo", "algo.loss": "ppo",
        "algo.clip_low": 0.2, "algo.clip_high": 0.2, "algo.agg": "seq-mean-token-mean",
        "algo.kl_coef": 0.0, "algo.entropy_coef": 0.0, "algo.ppo_epochs": 1,
        "algo.minibatches": 1, "algo.microbatch_size": args.microbatch,
        "model.dtype": "float32",
        # Step 1's rollout waits for the engine's compilations on a loaded machine.
        "rollout.episode_timeout_s": 3600.0,
        "optim.lr": args.lr, "optim.schedule": "constant", "optim.warmup_steps": 0,
        "optim.weight_decay": 0.0, "optim.b1": 0.9, "optim.b2": 0.99, "optim.grad_clip": 1.0,
        # The evaluation after the last step is outside the steps measured: keep it small.
        "eval.every": 0, "eval.num_tasks": b, "eval.samples": 0,
        "data.test_questions": f"1:{b}", "checkpoint.every": 0,
        "log.tensorboard": False, "log.progress": False, "log.samples": 1,
    }
    return [f"--config.{key}={value}" for key, value in values.items()]


def run_agentjax(args, out: Path, extra: list[str], cpus: set[int]) -> dict:
    workdir = out / "agentjax"
    if workdir.exists():
        raise SystemExit(f"{workdir} exists: give a fresh --out (this bench never resumes)")
    variant = "test" if args.tiny else "cpu"
    argv = [sys.executable, str(TRAIN), f"--config={CONFIG}:{variant}",
            f"--workdir={workdir}", *agentjax_overrides(args), *extra]
    out.mkdir(parents=True, exist_ok=True)
    process = measured_process(argv, out / "agentjax.log", cpus=cpus, nice=args.nice,
                               threads=args.threads,
                               env={**os.environ, "JAX_PLATFORMS": "cpu"})
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    groups = [json.loads(line)["tasks"]
              for line in (workdir / "trained_groups.jsonl").read_text().splitlines()]
    final = json.loads((workdir / "final.json").read_text())
    steps = [{"rollout_s": r["time/rollout_s"], "update_s": r["time/update_s"],
              "step_s": r["time/step_s"],
              "tokens": r["rollout/tokens_per_s"] * r["time/rollout_s"],
              "reward": r["reward/mean"]} for r in rows]
    return {"steps": steps, "tasks": groups, **process,
            "programs": final.get("compile/programs"), "workdir": str(workdir),
            "prompt": first_sampled_prompt(workdir / "samples" / "rl_000001.md")}


def first_sampled_prompt(path: Path) -> tuple[str, str]:
    """(task id, prompt text) of the first episode of agentjax's sample file."""
    text = path.read_text()
    task = re.search(r"; task '([^']+)'", text)
    prompt = re.search(r"#### prompt \(\d+ tokens, masked\)\n```\n(.*?)\n```\n", text, re.S)
    if not task or not prompt:
        raise SystemExit(f"{path}: no sampled episode to compare prompts with")
    return task.group(1), prompt.group(1)


def run_trl(args, out: Path, agentjax: dict, cpus: set[int]) -> dict:
    spec = {"model": args.model, "prompts": args.prompts, "group": args.group,
            "max_new_tokens": args.max_new_tokens, "steps": args.steps, "lr": args.lr,
            "seed": args.seed, "threads": args.threads, "microbatch": args.microbatch,
            "tasks": agentjax["tasks"],
            "agentjax_workdir": agentjax["workdir"], "out": str(out / "trl")}
    (out / "trl").mkdir(parents=True, exist_ok=True)
    spec_path = out / "trl" / "spec.json"
    spec_path.write_text(json.dumps(spec))
    argv = [sys.executable, __file__, "--trl_worker", str(spec_path)]
    process = measured_process(argv, out / "trl.log", cpus=cpus, nice=args.nice,
                               threads=args.threads)
    return {**json.loads((out / "trl" / "result.json").read_text()), **process}


# ----------------------------------------------------------------- agentjax's reward, served


def reward_server(workdir: str, model: str) -> None:
    """Answers JSON lines on stdin, one a line on stdout: {"op": "messages", "tasks": [id]}
    -> the python env's first messages per task; {"op": "rewards", "tasks": [id],
    "ids": [[token]]} -> agentjax's reward of each one-turn episode. Logs go to stderr."""
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    from agentjax.agents.loop import action_text
    from agentjax.config.saved import load_saved
    from agentjax.envs.registry import build_suite
    from agentjax.models.tokenizer import load_tokenizer

    config = load_saved(os.path.join(workdir, "config.json"))
    suite = build_suite(config, os.path.join(workdir, "data"))
    tasks = {t.task_id: t for t in suite.train_tasks}
    tokenizer = load_tokenizer(model)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "messages":
            answer = [suite.make_env().reset(tasks[t]) for t in request["tasks"]]
        else:
            answer = []
            for task_id, ids in zip(request["tasks"], request["ids"], strict=True):
                env, task = suite.make_env(), tasks[task_id]
                env.reset(task)
                env.step(action_text(tokenizer, ids))
                answer.append(float(suite.reward_fn(task, env.log)[0]))
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


class RewardClient:
    """The TRL process's end of `reward_server`."""

    def __init__(self, workdir: str, model: str):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--reward_server", workdir, model],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def ask(self, request: dict):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the reward server exited (status {self.process.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


# ------------------------------------------------------------------------------- TRL side


def trl_tool_support(tokenizer) -> str:
    """What TRL's own checks say of running its tool loop with this tokenizer."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    problems = []
    if not supports_tool_calling(tokenizer):
        problems.append("its chat template does not render tool calls and tool messages "
                        "(trl.chat_template_utils.supports_tool_calling is False)")
    try:
        add_response_schema(tokenizer)
    except ValueError as error:
        problems.append(f"TRL has no response parser for it ({str(error).split('.')[0]})")
    return "; ".join(problems) or "TRL's checks pass for this template"


def trl_worker(spec_path: str) -> None:
    """One TRL GRPO run (module docstring) from the spec run_trl wrote; writes
    result.json beside it."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    out, group = Path(spec["out"]), spec["group"]
    rewards = RewardClient(spec["agentjax_workdir"], spec["model"])
    order = [task for step in spec["tasks"] for task in step]
    messages = rewards.ask({"op": "messages", "tasks": order})
    dataset = Dataset.from_list([{"prompt": m, "task_id": t} for m, t in zip(messages, order)])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tool_support = trl_tool_support(AutoTokenizer.from_pretrained(spec["model"]))
    prompts = {t: tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
               for m, t in zip(messages, order)}
    steps: list[dict] = []

    def agentjax_reward(prompts, completions, completion_ids, task_id, **_):
        scores = rewards.ask({"op": "rewards", "tasks": list(task_id),
                              "ids": [list(map(int, ids)) for ids in completion_ids]})
        steps.append({"reward": float(np.mean(scores)),
                      "tokens": int(sum(len(ids) for ids in completion_ids))})
        return scores

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            steps[-1]["rollout_s"] = time.perf_counter() - started
            return result

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step = steps[-1]
            step["step_s"] = time.perf_counter() - self.started
            step["update_s"] = step["step_s"] - step["rollout_s"]

    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=spec["microbatch"],
        gradient_accumulation_steps=spec["prompts"] * group // spec["microbatch"],
        num_generations=group, max_completion_length=spec["max_new_tokens"],
        num_iterations=1, shuffle_dataset=False, max_steps=spec["steps"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, loss_type="grpo", scale_rewards="group", epsilon=0.2, epsilon_high=0.2,
        temperature=1.0, top_p=1.0, top_k=0, seed=spec["seed"],
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0)
    if getattr(config, "activation_checkpointing", config.gradient_checkpointing):
        raise RuntimeError("TRL kept activation checkpointing on; agentjax's side has none")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    trainer = Timed(model=model, reward_funcs=agentjax_reward, args=config,
                    train_dataset=dataset, processing_class=tokenizer,
                    callbacks=[StepClock()])
    try:
        trainer.train()
    finally:
        rewards.close()
    (out / "result.json").write_text(json.dumps(
        {"steps": steps, "prompts": prompts, "tool_support": tool_support}))


# ---------------------------------------------------------------------------------- report


def summary(side: dict) -> dict:
    """Means over steps 2..N (over the one step when there is one), step 1, steps per
    hour, tokens, the reward's mean and standard error over steps."""
    steps = side["steps"]
    later = steps[1:] or steps

    def mean(key, rows=later):
        return float(np.mean([s[key] for s in rows]))

    rewards = [s["reward"] for s in steps]
    return {"step_s": mean("step_s"), "rollout_s": mean("rollout_s"),
            "update_s": mean("update_s"), "first_s": steps[0]["step_s"],
            "per_hour": 3600 / mean("step_s"), "per_hour_all": 3600 / mean("step_s", steps),
            "tokens": mean("tokens", steps),
            "tokens_per_s": sum(s["tokens"] for s in later) / sum(s["rollout_s"] for s in later),
            "reward": float(np.mean(rewards)),
            "reward_se": float(np.std(rewards, ddof=1) / np.sqrt(len(rewards)))
            if len(rewards) > 1 else float("nan"),
            "peak_gib": side["peak_gib"], "wall_s": side["wall_s"]}


def report(args, agentjax: dict, trl: dict, prompt_check: str, command: str) -> str:
    a, t = summary(agentjax), summary(trl)
    later = "steps 2..N" if args.steps > 1 else "the one step"
    speedup, speedup_all = a["per_hour"] / t["per_hour"], a["per_hour_all"] / t["per_hour_all"]
    memory = a["peak_gib"] / t["peak_gib"]
    best = Ratio.of(Runs(tuple(s["step_s"] for s in trl["steps"][1:] or trl["steps"])),
                    Runs(tuple(s["step_s"] for s in agentjax["steps"][1:]
                               or agentjax["steps"])))
    rows = [
        (f"s / step ({later}, mean)", "step_s", ".2f", f"{t['step_s'] / a['step_s']:.2f}x faster"),
        ("  rollout s", "rollout_s", ".2f", f"{t['rollout_s'] / a['rollout_s']:.2f}x faster"),
        ("  update s", "update_s", ".2f", f"{t['update_s'] / a['update_s']:.2f}x faster"),
        ("s of step 1 (agentjax: compiling)", "first_s", ".2f", ""),
        (f"steps / hour ({later})", "per_hour", ".1f", f"**{speedup:.2f}x**"),
        ("steps / hour (all N steps)", "per_hour_all", ".1f", f"{speedup_all:.2f}x"),
        ("generated tokens / step", "tokens", ".0f", ""),
        (f"generated tokens / s of rollout ({later})", "tokens_per_s", ".1f",
         f"{a['tokens_per_s'] / t['tokens_per_s']:.2f}x"),
        ("peak RSS GiB", "peak_gib", ".2f", f"**{memory:.2f}x**"),
        ("process wall s (load, compile, steps, eval, save)", "wall_s", ".0f", ""),
        ("mean reward over steps (± s.e.)", "reward", ".3f", ""),
    ]
    lines = [f"# agentjax vs TRL {trl_version()} GRPO: {Path(args.model).name}, "
             f"{args.prompts} prompts x {args.group} samples, {args.max_new_tokens} new "
             f"tokens, lr {args.lr:g}, {args.steps} steps", "",
             f"    {command}", "",
             "| | agentjax | TRL | agentjax / TRL |", "|---|---|---|---|"]
    for name, key, fmt, ratio in rows:
        cells = [format(side[key], fmt) + (f" ± {side['reward_se']:.3f}"
                                           if key == "reward" else "") for side in (a, t)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {ratio} |")
    lines += ["", "Mean reward per step (agentjax's exact match, same tasks each step):", "",
              "| step | " + " | ".join(str(i + 1) for i in range(args.steps)) + " |",
              "|---" * (args.steps + 1) + "|"]
    for name, side in (("agentjax", agentjax), ("TRL", trl)):
        lines.append(f"| {name} | " + " | ".join(f"{s['reward']:.3f}" for s in side["steps"])
                     + " |")
    difference = a["reward"] - t["reward"]
    noise = 2 * float(np.hypot(a["reward_se"], t["reward_se"]))
    verdicts = [
        f"steps per hour {speedup:.2f}x TRL's ({later}; goal >= {GOAL_SPEEDUP:g}x): "
        + ("met" if speedup >= GOAL_SPEEDUP else "missed"),
        f"peak memory {memory:.2f}x TRL's (goal <= {GOAL_MEMORY:g}x): "
        + ("met" if memory <= GOAL_MEMORY else "missed"),
        f"reward: agentjax - TRL = {difference:+.3f}, two standard errors {noise:.3f}: "
        + ("not worse within noise" if np.isnan(noise) or difference >= -noise
           else "worse beyond noise"),
    ]
    lines += ["", *[f"- {v}" for v in verdicts], "",
              f"- best step against best step (timing.Ratio, spread over {later}): "
              f"TRL / agentjax {best.text()}",
              f"- agentjax compiled {agentjax['programs']} programs (final.json)",
              f"- both sides: {args.threads} thread(s) on CPUs {sorted(cpus_of(args))}, "
              f"nice {args.nice}, one after the other (agentjax first); peak RSS is "
              "each process's ru_maxrss; the machine's 1-minute load average from start "
              "to end: agentjax {:.1f} -> {:.1f}, TRL {:.1f} -> {:.1f}".format(
                  *agentjax["load"], *trl["load"]),
              "- task: the single-turn part of agentjax's python-tool arithmetic "
              "(env.max_turns=1); TRL's tool loop on this model: "
              + trl["tool_support"],
              f"- prompts: {prompt_check}; agentjax's context rollout.max_tokens = "
              f"{args.max_tokens} (engine KV and update buckets; TRL pads to the batch)"]
    return "\n".join(lines) + "\n"


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def cpus_of(args) -> set[int]:
    available = sorted(os.sched_getaffinity(0))
    if args.threads > len(available):
        raise SystemExit(f"--threads {args.threads}: only {len(available)} CPUs available")
    return set(available[:args.threads])


def check_prompts(agentjax: dict, trl: dict) -> str:
    """agentjax's first sampled prompt against TRL's rendering of the same task."""
    task, text = agentjax["prompt"]
    theirs = trl["prompts"][task]
    if theirs != text:
        raise SystemExit(f"the prompts differ for task {task!r}:\nagentjax:\n{text}\n"
                         f"TRL:\n{theirs}")
    return f"agentjax's and TRL's rendering of task {task!r} are the same text"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trl_worker"]:
        trl_worker(argv[1])
        return 0
    if argv[:1] == ["--reward_server"]:
        reward_server(argv[1], argv[2])
        return 0
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an HF folder (both libraries)")
    parser.add_argument("--tiny", action="store_true",
                        help="a test-sized run: grpo_python.py:test, 1 prompt x 2, 8 new "
                             "tokens, 2 steps unless given")
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--group", type=int)
    parser.add_argument("--max_new_tokens", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--microbatch", type=int,
                        help="sequences per forward-backward, gradients accumulated to one "
                             "update of prompts x group (both sides)")
    parser.add_argument("--max_tokens", type=int,
                        help="agentjax's context per episode (prompt + answer): its "
                             "engine's KV and its update's length buckets")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--out", default="runs/vs_trl")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    # The tiny tokenizer spends a token on most characters: its prompt is ~540 tokens;
    # SmolLM2's is 262.
    defaults = (1, 2, 8, 2, 768, 2) if args.tiny else (2, 4, 64, 3, 512, 1)
    for name, default in zip(("prompts", "group", "max_new_tokens", "steps", "max_tokens",
                              "microbatch"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.prompts * args.group % args.microbatch:
        raise SystemExit(f"--microbatch {args.microbatch} must divide prompts x group "
                         f"= {args.prompts * args.group}")
    args.model = str(Path(args.model).resolve())
    out, cpus = Path(args.out), cpus_of(args)
    command = "python scripts/bench/vs_trl.py " + " ".join(argv)
    agentjax = run_agentjax(args, out, extra, cpus)
    trl = run_trl(args, out, agentjax, cpus)
    text = report(args, agentjax, trl, check_prompts(agentjax, trl), command)
    (out / "vs_trl.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
