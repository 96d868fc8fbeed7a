"""A training run in miniature for the tracker kill tests (test_tracking_kills.py): the
stages pretrain, sft and rl of STEPS steps each, a checkpoint every 2 steps, every row
through MetricsWriter into the run's trackers (Tracking.start, as scripts/train.py),
an evaluation after SFT, sampled episodes at every RL step, the report at the end.
A rerun in the workdir resumes like the real run: each stage from its checkpoint.

Prints `handed <stage> <step>` once a row went to the trackers (and `handed report`)
so that a test can SIGKILL it there; each step takes STEP_S, as a real step takes
its time, so that a kill lands after the trackers took the row (the first few rows
wait for the trackers' start).

    python -m tests.train.tracked_stages WORKDIR MLFLOW_URI
"""
import json
import os
import sys
import threading
import time

from agentjax.config import default_config
from agentjax.core import atomic
from agentjax.train.metrics import MetricsWriter
from agentjax.train.trackers.wandb_run import WandbRun
from agentjax.train.tracking import Table, Tracking

STEPS = 4
STEP_S = 0.2  # a step's time: the trackers take each row before the next one comes
STAGES = {"pretrain": "pretrain", "sft": "sft", "rl": ""}  # stage -> folder in the workdir
SFT_EVAL = {"sft/success_greedy": 0.5, "sft/success_greedy/hops=1": 0.25}


def row(stage: str, step: int) -> dict:
    base = list(STAGES).index(stage) * 10 + step
    return {"loss": base / 8, "kl": float("nan") if step == 2 else base / 16}


def config(mlflow_uri: str):
    config = default_config()
    config.log.wandb.mode = "offline"
    config.log.mlflow.tracking_uri = mlflow_uri
    config.log.tensorboard = True
    return config


def main(workdir: str, mlflow_uri: str) -> None:
    # A real run builds its model while the trackers start: its rows come once W&B's
    # run has started (seconds).
    started, start = threading.Event(), WandbRun.start

    def start_then_tell(self, run_id):
        try:
            return start(self, run_id)
        finally:
            started.set()

    WandbRun.start = start_then_tell
    os.makedirs(workdir, exist_ok=True)
    tracking = Tracking.start(config(mlflow_uri), workdir, enabled=True, log=print)
    assert started.wait(120), "W&B did not start in 120 s"
    for stage, folder in STAGES.items():
        folder = os.path.join(workdir, folder)
        os.makedirs(folder, exist_ok=True)
        checkpoint = os.path.join(folder, "checkpoint.json")
        done = json.load(open(checkpoint))["step"] if os.path.exists(checkpoint) else 0
        writer = MetricsWriter(folder, stage=stage, tracking=tracking, resume_step=done)
        for step in range(done + 1, STEPS + 1):
            writer.write(step, row(stage, step))
            if stage == "rl":
                tracking.log_samples("rl", step, Table(("reward",), [[step / 4]]))
            print(f"handed {stage} {step}", flush=True)
            time.sleep(STEP_S)
            if step % 2 == 0:
                atomic.write_json(checkpoint, {"step": step})
        if stage == "sft":
            tracking.log_evaluation("sft", STEPS, SFT_EVAL)
    tracking.log_report({"eval/success_sampled": 0.5}, Table(("policy",), [["RL"]]), STEPS)
    print("handed report", flush=True)
    tracking.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
