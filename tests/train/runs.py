"""Runs of scripts/train.py for the end-to-end tests, and the kill campaign: a run
SIGKILLed again and again at seeded points until it finishes must end exactly as the
uninterrupted run (scripts/bench/reliability.py runs a longer campaign).

    reference = ...; train("grpo_search.py:test", reference)
    counts = kill_campaign("grpo_search.py:test", workdir, kills=12, seed=0)
    assert differences(reference, workdir) == []
"""
from __future__ import annotations

import collections
import fcntl
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from agentjax.core import atomic
from agentjax.train.checkpoint import latest_committed_step
from agentjax.train.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "scripts", "train.py")
# Wall-clock and scheduling keys differ between runs (which sequence reaches a shared
# context first, what one engine lane or server caches), and so do the programs a
# process compiled (a resumed run counts its own); everything else must be identical.
TIMING = ("time/", "rollout/tokens_per_s", "rollout/cached_token_frac", "compile/")
# RL from the initial model: no pretraining, no SFT (shorter runs).
RL_ONLY = ("--config.pretrain.steps=0", "--config.sft.steps=0")


def with_devices(count: int) -> dict:
    """The environment of a subprocess with `count` fake CPU devices, the tests' other
    XLA flags and their shared compilation cache kept (tests/conftest.py)."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
             if not flag.startswith("--xla_force_host_platform_device_count")]
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(
        [*flags, f"--xla_force_host_platform_device_count={count}"])}


ONE_DEVICE = with_devices(1)


def _argv(config: str, workdir, overrides) -> list[str]:
    return [sys.executable, TRAIN, f"--config={ROOT}/configs/{config}",
            f"--workdir={workdir}", *overrides]


def train(config, workdir, *overrides, env=ONE_DEVICE) -> str:
    """Runs scripts/train.py on configs/`config` to the end; its output (asserting
    success)."""
    process = subprocess.Popen(_argv(config, workdir, overrides), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-4000:]
    return out


class FinishedRuns:
    """Runs of scripts/train.py that the tests of one pytest session (all its xdist
    workers) share: the first test asking for a config and overrides runs it, the
    others wait for it and get the same workdir. A test must not write into that
    workdir: it copies it (shutil.copytree) to resume or change it."""

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __call__(self, config: str, *overrides: str) -> tuple[Path, str]:
        """(the workdir, the output) of the finished run of `config` with `overrides`."""
        key = hashlib.sha1(json.dumps([config, overrides]).encode()).hexdigest()[:16]
        workdir, output = self.root / key, self.root / f"{key}.out"
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be running it
            if not output.exists():
                shutil.rmtree(workdir, ignore_errors=True)  # a failed attempt's
                atomic.write_text(output, train(config, workdir, *overrides))
            return workdir, output.read_text()


def check_finished_run(config: str, workdir, out: str) -> None:
    """What every config's `:test` run must have done, given its workdir and output."""
    workdir = Path(workdir)
    final = json.loads((workdir / "final.json").read_text())
    assert "sft/success_greedy" in final and final["time/sft_eval_s"] > 0  # evaluations timed
    assert (workdir / "sft" / "hf" / "model.safetensors").exists()
    if not config.startswith("sft"):
        assert "eval/success_sampled" in final and final["time/eval_s"] > 0
        rows = read_metrics(str(workdir))
        assert [r["step"] for r in rows] == [1, 2]
        for row in rows:
            assert row["mask/leak"] == 0
            assert "grad_norm" in row and "entropy" in row and "reward/mean" in row
            # The float32 engine's log-probs are the trainer's to rounding (measured: the
            # ratio within 5e-7 of 1), logged every step; no mask is on.
            assert abs(math.log(row["logp_mismatch_ratio_max"])) < 1e-4
            assert abs(math.log(row["logp_mismatch_ratio_min"])) < 1e-4
            assert row["rollout_correction/masked_tokens"] == 0
        assert (workdir / "hf" / "model.safetensors").exists()
    assert "| RL agent |" in out or config.startswith("sft")
    if "search" in config:  # held-out success split by what SFT taught (evaluate.py)
        assert [r["step"] for r in read_metrics(str(workdir / "pretrain"))] == [1, 2]
        assert any(k.startswith("sft/success_greedy/taught=") for k in final)
        assert "sampled, taught=" in out


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def _committed(folder: str, step: int):
    return lambda w: (latest_committed_step(os.path.join(w, folder)) or 0) >= step


# What a run has done, in the order it does it: each mark, once there, stays.
PROGRESS = (
    ("init model written", lambda w: os.path.isdir(os.path.join(w, "init_model"))),
    ("pretraining step 1 committed", _committed("pretrain/checkpoints", 1)),
    ("pretraining exported", lambda w: os.path.isdir(os.path.join(w, "pretrain", "hf"))),
    ("SFT step 1 committed", _committed("sft/checkpoints", 1)),
    ("SFT exported", lambda w: os.path.isdir(os.path.join(w, "sft", "hf"))),
    ("SFT evaluated", lambda w: os.path.exists(os.path.join(w, "sft", "eval.json"))),
    # orbax makes the folder before RL's first step; the first RL checkpoint comes later.
    ("RL checkpoint folder made", lambda w: os.path.isdir(os.path.join(w, "checkpoints"))),
    ("RL step 1 committed", _committed("checkpoints", 1)),
    ("RL exported", lambda w: os.path.isdir(os.path.join(w, "hf"))),
    ("finished", lambda w: os.path.exists(os.path.join(w, "final.json"))),
)


def progress(workdir) -> str:
    """The last PROGRESS mark `workdir` has reached ("started" before the first)."""
    reached = "started"
    for name, done in PROGRESS:
        if not done(str(workdir)):
            break
        reached = name
    return reached


def temporaries(workdir) -> list[str]:
    """The temporary files and folders of writes in progress (or killed) in `workdir`:
    atomic writes' and checkpoints'."""
    return sorted(os.path.relpath(os.path.join(dirpath, name), workdir)
                  for dirpath, dirs, files in os.walk(workdir) for name in dirs + files
                  if name.endswith((".tmp", ".old")) or "orbax-checkpoint-tmp" in name)


def _start_until(config: str, workdir, overrides, *, until, env, timeout_s: float,
                 poll_s: float, new_session: bool = False):
    """Starts `config` in `workdir` (output in <workdir>.log; in a process group of its
    own if `new_session`) and returns (process, log path) once `until(workdir)` holds
    or the run has exited."""
    log_path = f"{workdir}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(_argv(config, workdir, overrides), stdout=log,
                                   stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                   start_new_session=new_session)
    deadline = time.time() + timeout_s
    while process.poll() is None and not until(str(workdir)):
        assert time.time() < deadline, f"the condition did not hold in {timeout_s}s"
        time.sleep(poll_s)
    return process, log_path


def kill_when(config: str, workdir, *overrides, when, env=ONE_DEVICE,
              timeout_s: float = 600, tree: bool = False) -> None:
    """Runs `config` in `workdir` and SIGKILLs it as soon as `when(workdir)` holds
    (asserting it was still running then); with `tree`, its process group and its
    children too (`kill_tree`)."""
    process, log_path = _start_until(config, workdir, overrides, until=when, env=env,
                                     timeout_s=timeout_s, poll_s=0.02, new_session=tree)
    assert process.poll() is None, Path(log_path).read_text()[-4000:]
    if tree:
        kill_tree(process.pid)
    else:
        process.send_signal(signal.SIGKILL)
    process.wait()


def kill_tree(pid: int) -> None:
    """SIGKILLs the children of process `pid` (W&B's service, which runs in a session
    of its own), then its process group (`pid` leads it)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # it ended meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # its parent's id
                os.kill(int(entry), signal.SIGKILL)
    os.killpg(pid, signal.SIGKILL)


def kill_campaign(config: str, workdir, *overrides, kills: int, seed: int,
                  max_delay_s: float = 2.0, env=ONE_DEVICE, timeout_s: float = 600
                  ) -> dict[str, int]:
    """Runs `config` in `workdir`, SIGKILLing it `kills` times, then lets it finish.

    Each kill waits for a PROGRESS mark and then a seeded delay of up to `max_delay_s`.
    The marks are taken in order: every mark but "finished" once per len(PROGRESS) - 1
    kills, the rest a seeded draw (one the workdir already has is there at once, so
    that kill lands in the restart). Returns how many kills landed after each mark
    (keys "after <mark>"), how many "during a write" (a temporary of a checkpoint or an
    atomic write was there: in progress, or an earlier kill's not yet redone) and how
    many runs "finished first" (ended before their kill).
    """
    rng = np.random.default_rng(seed)
    every = len(PROGRESS) - 1
    marks = sorted([*range(every)] * (kills // every)
                   + [*rng.choice(every, kills % every, replace=False)])
    delays = rng.uniform(0, max_delay_s, size=kills)
    counts = collections.Counter()
    for mark, delay in zip(marks, delays):
        counts[kill_once(config, workdir, *overrides, mark=PROGRESS[mark][0], delay_s=delay,
                         env=env, timeout_s=timeout_s)] += 1
        counts["during a write"] += bool(temporaries(workdir))
    train(config, workdir, *overrides, env=env)
    return dict(counts)


def kill_once(config: str, workdir, *overrides, mark: str, delay_s: float, env=ONE_DEVICE,
              timeout_s: float = 600) -> str:
    """Runs `config` in `workdir` until the PROGRESS mark named `mark` and `delay_s`
    seconds more, then SIGKILLs it. Returns "after <the mark reached>" or, when the run
    ended first, "finished first"."""
    process, log_path = _start_until(config, workdir, overrides,
                                     until=dict(PROGRESS)[mark], env=env,
                                     timeout_s=timeout_s, poll_s=0.05)
    time.sleep(delay_s)
    outcome = "finished first"
    if process.poll() is None:
        outcome = f"after {progress(workdir)}"
        process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode in (0, -signal.SIGKILL), Path(log_path).read_text()[-4000:]
    return outcome


def _weights(folder) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def differences(reference, workdir) -> list[str]:
    """What differs between two finished runs of one config (timings aside): every
    stage's metrics, the SFT evaluation, the final results and every exported model."""
    reference, workdir = Path(reference), Path(workdir)
    found = []
    for stage in ("pretrain", "sft", ""):
        if (reference / stage / "metrics.jsonl").exists() and comparable(
                read_metrics(reference / stage)) != comparable(read_metrics(workdir / stage)):
            found.append(f"{stage or 'RL'} metrics")
    for name in ("sft/eval.json", "final.json"):
        if not (reference / name).exists():  # a stage this config does not run
            continue
        want, got = (json.loads((run / name).read_text()) for run in (reference, workdir))
        if comparable([want]) != comparable([got]):
            found.append(name)
    for folder in ("init_model", "pretrain/hf", "sft/hf", "hf"):
        if not (reference / folder).is_dir():  # a stage this config does not run
            continue
        want, got = _weights(reference / folder), _weights(workdir / folder)
        if not want or want.keys() != got.keys() or any(
                not np.array_equal(want[k], got[k]) for k in want):
            found.append(f"{folder} weights")
    return found
