"""One run of a config, top to bottom: runtime -> task suite -> policy -> rollouts ->
stages -> report.

    results = run(config, workdir)          # what scripts/train.py calls

  1. runtime    validate the config, join the other hosts, build the mesh (train/runtime.py)
  2. suite      the env's tasks, demonstrations and reward (envs/registry.py)
  3. policy     the model and tokenizer: init_from, model.path or a tiny one built here
                (train/policy.py)
  4. rollouts   engine + pool holding the policy, sampling, evaluation (train/rollouts.py)
  5. stages     pretraining and SFT (train/stages/sft.py), then RL (stages/rl.py), or RFT
                / DPO on the policy's own episodes (stages/offline.py), as config.stage says
  6. report     held-out success of the demonstrator, the SFT agent and the RL (RFT, DPO)
                agent: <workdir>/final.json, a table on stdout and in the trackers
                (train/tracking.py: W&B, MLflow, TensorBoard), which then finish

Resume: every stage checkpoints into the workdir (orbax: device state; json: sampler and
step); rerunning with the same `--workdir` continues where the run stopped, with the same
data order and random streams. What a rerun reads back is written atomically
(core/atomic.py; orbax commits checkpoints by renaming), and which stage is done is
decided from committed checkpoints and sft/eval.json, never from a folder's existence: a
kill at any point, repeated any number of times, gives the uninterrupted run.

A rerun resumes only the experiment the workdir holds: its config is compared with the
one in effect there before anything is built (config/resume.py), config.json keeps the
config the run started with, and what each start ran and changed is recorded
(train/provenance.py: code_versions.jsonl, config_changes.jsonl).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import ml_collections

from agentjax.agents.evaluation import group_of
from agentjax.config.preflight import check_runtime
from agentjax.config import check_resume, validate
from agentjax.core import atomic, compiles
from agentjax.engine.jax.programs import PROGRAMS as ENGINE_PROGRAMS
from agentjax.envs.registry import TaskSuite, build_suite
from agentjax.train.checkpoint import latest_committed_step
from agentjax.train.policy import ADAPTER_DIR, HF_DIR, Policy
from agentjax.train.provenance import changes_report, record_start
from agentjax.train.rollouts import Rollouts
from agentjax.train.runtime import CHECKPOINTS, Runtime
from agentjax.train.stages.offline import run_offline
from agentjax.train.stages.rl import run_rl
from agentjax.train.stages.sft import run_sft
from agentjax.train.tracking import Table

SFT_RESULTS = os.path.join("sft", "eval.json")  # written once SFT has finished


def run(config: ml_collections.ConfigDict, workdir: str, *,
        allow_config_change: Sequence[str] = ()) -> dict[str, Any]:
    """Pretraining and SFT (if configured), RL, RFT or DPO (config.stage; none for
    "sft"), then the final report (module docstring). A rerun in a workdir holding a
    run resumes it when `config` changes no key that would make it another experiment,
    or only such keys named in `allow_config_change` (config/resume.py: else a
    ConfigError, before anything is built)."""
    started = time.perf_counter()
    validate(config)
    changes = check_resume(config, workdir, allow_config_change)
    runtime, suite, policy, rollouts = set_up(config, workdir, record_config=changes is None)
    try:
        record_start(config, runtime, changes)
        results = baseline_results(suite)
        params = policy.params
        if (config.pretrain.steps or config.sft.steps) and not config.init_from:
            params, sft_results = warm_start(config, runtime, policy, suite, rollouts, params)
            results.update(sft_results)
            if config.stage != "sft":
                last = "sft" if config.sft.steps else "pretrain"
                params = policy.next_stage(
                    params, os.path.join(runtime.workdir, last, HF_DIR), seed=config.seed)
        if config.stage != "sft":
            stage = run_rl if config.stage == "rl" else run_offline
            _, last_eval = stage(config, runtime, policy, rollouts, params)
            results.update(last_eval)
    except BaseException:
        runtime.tracking.close(failed=True)
        raise
    finally:
        rollouts.close()
    results["time/total_s"] = time.perf_counter() - started
    # Every program this process compiled (a resumed run: since it resumed), the
    # engine's by name: a run's compile cost, bounded by tests/train/test_run.py.
    programs = compiles.counts()
    results.update(compiles.metrics(programs, ENGINE_PROGRAMS))
    runtime.log(f"compiled {compiles.summary(programs)}")
    agent = "RL agent" if config.stage in ("rl", "sft") else f"{config.stage.upper()} agent"
    if runtime.is_main:
        atomic.write_json(os.path.join(runtime.workdir, "final.json"), results)
        print(report_table(results, agent=agent))
        accepted = changes_report(runtime.workdir)
        if accepted:
            print(accepted)
    track_end(config, runtime, results, agent)
    return results


def track_end(config: ml_collections.ConfigDict, runtime: Runtime, results: dict[str, float],
              agent: str) -> None:
    """The report (and with log.artifacts the final export) to the trackers, which
    then finish."""
    last_step = config.sft.steps if config.stage == "sft" else config.total_steps
    header, rows = report_rows(results, agent)
    runtime.tracking.log_report(results, Table(tuple(header), rows), step=last_step)
    if config.log.artifacts:
        folder = os.path.join(runtime.workdir, "sft" if config.stage == "sft" else "")
        for name in (HF_DIR, ADAPTER_DIR):
            if os.path.isdir(os.path.join(folder, name)):
                runtime.tracking.log_artifact(os.path.join(folder, name), name, step=last_step)
    runtime.tracking.close()


def set_up(config: ml_collections.ConfigDict, workdir: str, *, record_config: bool = True,
           tracked: bool = True) -> tuple[Runtime, TaskSuite, Policy, Rollouts]:
    """Steps 1-4 of a run (module docstring): what its stages, the evaluation script
    and the tests start from; `record_config`: write <workdir>/config.json; `tracked`:
    open the run's experiment trackers. The caller closes the rollouts."""
    validate(config)
    check_runtime(config)
    runtime = Runtime.start(config, workdir, record_config=record_config, tracked=tracked)
    suite = load_suite(config, runtime)
    policy = Policy.load(config, runtime, texts=lambda: suite.texts)
    return runtime, suite, policy, Rollouts.build(config, runtime, policy, suite)


def load_suite(config: ml_collections.ConfigDict, runtime: Runtime) -> TaskSuite:
    start = time.perf_counter()
    suite = build_suite(config, os.path.join(runtime.workdir, "data"))
    runtime.log(f"task suite {config.env.name!r}: {len(suite.train_tasks)} train / "
                f"{len(suite.test_tasks)} test tasks, {len(suite.demonstrations)} "
                f"demonstrations ({time.perf_counter() - start:.1f}s)")
    return suite


def baseline_results(suite: TaskSuite) -> dict[str, float]:
    """Held-out success of the suite's scripted policies (the demonstrator among them)."""
    results = {f"demonstrator/{k}": v["success"] for k, v in suite.baselines.items()}
    for name, baseline in suite.baselines.items():
        results.update({f"demonstrator/{name}/hops={h}": v
                        for h, v in baseline["by_hops"].items()})
    return results


def warm_start(config, runtime: Runtime, policy: Policy, suite: TaskSuite, rollouts: Rollouts,
               params):
    """(params after pretraining and SFT, the SFT agent's held-out evaluation).

    sft/eval.json is written (atomically) once SFT has finished, and RL checkpoints only
    after it: with both, RL restores its whole state (the params returned here give it
    shapes only). Otherwise run_sft resumes from (or, when done, only restores) its
    committed checkpoints, so RL starts from the SFT params whatever point a kill hit."""
    sft_file = os.path.join(runtime.workdir, SFT_RESULTS)
    sft_results = None
    if os.path.exists(sft_file):
        with open(sft_file) as f:
            sft_results = json.load(f)
    rl_resumes = config.stage != "sft" and latest_committed_step(
        os.path.join(runtime.workdir, CHECKPOINTS)) is not None
    if sft_results is None or not rl_resumes:
        params = run_sft(config, runtime, policy, suite, params)
    if sft_results is None:
        sft_results = rollouts.evaluate(params, "sft")
        if runtime.is_main:
            atomic.write_json(sft_file, sft_results)
    # Every rerun passes it: a tracker takes it once, whenever a kill let it.
    runtime.tracking.log_evaluation("sft", config.sft.steps, sft_results)
    return params, sft_results


def report_rows(results: dict[str, float], agent: str = "RL agent"
                ) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report of held-out success: demonstrator, SFT agent, the
    agent of the stage after SFT (row `agent`); a column per task group (hops, taught:
    see agents/evaluation.py)."""
    rows = []
    groups = sorted({group_of(k) for k in results} - {None})

    def cells(prefix):
        return [f"{results[key]:.3f}" if key in results else "-"
                for key in [prefix] + [f"{prefix}/{g}" for g in groups]]

    rows.append(["demonstrator (scripted)", "-"] + cells("demonstrator/demonstrator"))
    for name, prefix in (("SFT agent", "sft"), (agent, "eval")):
        greedy = results.get(f"{prefix}/success_greedy")
        rows.append([name, "-" if greedy is None else f"{greedy:.3f}"]
                    + cells(f"{prefix}/success_sampled"))
    header = ["policy", "greedy", "sampled"] + [f"sampled, {g}" for g in groups]
    return header, rows


def report_table(results: dict[str, float], agent: str = "RL agent") -> str:
    """The report of `report_rows` as a markdown table."""
    header, rows = report_rows(results, agent)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
