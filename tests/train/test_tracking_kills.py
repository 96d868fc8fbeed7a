"""A run SIGKILLed (its whole process group and W&B's service) at several points and
resumed each time ends with every metrics.jsonl row of every stage in each tracker
exactly once: in the W&B run's offline `.wandb` files (read as wandb's own Record
protobufs), MLflow's metric history and TensorBoard's event files. The run is a
miniature one (tracked_stages.py: MetricsWriter and Tracking as scripts/train.py uses
them, seconds a process) with the real trackers."""
import os
import signal
import subprocess
import sys

import pytest

from agentjax.train.metrics import read_metrics
from agentjax.train.trackers.mlflow_run import mlflow_key
from tests.train import tracker_files, tracked_stages
from tests.train.runs import ROOT, kill_tree

pytestmark = pytest.mark.slow  # five processes, each starting W&B (seconds)

# Where each attempt is killed, once the trackers were handed that row: mid-SFT, the
# first RL step (the rows of the stages before it were lost from W&B there), the last
# RL step, the report (the trackers finishing).
KILLS = ("handed sft 3", "handed rl 1", "handed rl 4", "handed report")


def _env(home) -> dict:
    # W&B's service writes its transaction log every 0.2 s (x_transaction_log_flush_interval,
    # 15 s by default): a killed process's file holds rows, which the next one must not
    # send again, and misses the last ones, which it must.
    return {**os.environ, "WANDB_MODE": "offline", "MLFLOW_ALLOW_FILE_STORE": "true",
            "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL": "0.2",
            **{name: str(home) for name in
               ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}}


def kill_at(mark: str | None, workdir, uri: str, env: dict) -> str:
    """Runs tracked_stages.py in `workdir` and SIGKILLs its process group and its
    children once it printed `mark` (None: lets it finish). Its output."""
    process = subprocess.Popen([sys.executable, "-m", "tests.train.tracked_stages",
                                str(workdir), uri], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.strip() == mark:
            kill_tree(process.pid)
            break
    process.wait(timeout=120)
    out = "".join(lines)
    assert process.returncode == (0 if mark is None else -signal.SIGKILL), out[-3000:]
    return out


def _stage_rows(folder) -> list[dict]:
    return [{k: float(v) if isinstance(v, str) else v for k, v in row.items()}
            for row in read_metrics(folder)]


def _same(a, b) -> bool:
    return tracker_files.same_rows(a, b)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """The workdir after a kill at each of KILLS and a last attempt to the end."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("killed")
    workdir, uri, env = root / "run", f"file:{root / 'mlruns'}", _env(root / "wandb_home")
    for mark in (*KILLS, None):
        kill_at(mark, workdir, uri, env)
    return workdir, uri


def test_the_kills_landed_and_the_run_resumed(killed_run):
    workdir, _ = killed_run
    for stage, folder in tracked_stages.STAGES.items():
        assert [r["step"] for r in read_metrics(workdir / folder)] == [1, 2, 3, 4], stage
    assert len(tracker_files.wandb_runs(workdir)) == len(KILLS) + 1  # a .wandb file each


def test_wandb_holds_every_row_once(killed_run):
    workdir, _ = killed_run
    files = tracker_files.wandb_runs(workdir)
    assert len({tracker_files.wandb_run_record(records)["id"] for records in files}) == 1
    history = [row for records in files for row in tracker_files.wandb_history(records)]
    killed = [row for records in files[:-1] for row in tracker_files.wandb_history(records)]
    assert killed and len(killed) < len(history)  # each side of the kills sent some
    for stage, folder in tracked_stages.STAGES.items():
        rows = [r for r in tracker_files.stage_rows(history, stage) if "loss" in r]
        assert _same(rows, _stage_rows(workdir / folder)), stage
    evaluations = [r for r in history if "sft/success_greedy" in r]
    assert len(evaluations) == 1 and evaluations[0]["sft/step"] == tracked_stages.STEPS
    summaries = [tracker_files.wandb_summary(records) for records in files]
    assert any(s.get("final/eval/success_sampled") == 0.5 for s in summaries)


def test_mlflow_holds_every_row_once(killed_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    workdir, uri = killed_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("agentjax").experiment_id])
    assert run.info.status == "FINISHED"
    for stage, folder in tracked_stages.STAGES.items():
        rows = _stage_rows(workdir / folder)
        for key in ("loss", "kl"):
            history = client.get_metric_history(run.info.run_id, mlflow_key(f"{stage}/{key}"))
            assert _same(sorted((m.step, m.value) for m in history),
                         [(r["step"], r[key]) for r in rows]), (stage, key)
    evaluation = client.get_metric_history(run.info.run_id, "sft/success_greedy")
    assert [(m.step, m.value) for m in evaluation] == [(tracked_stages.STEPS, 0.5)]


def test_tensorboard_holds_every_row_once(killed_run):
    workdir, _ = killed_run
    scalars = tracker_files.tensorboard_scalars(workdir / "tb")
    for stage, folder in tracked_stages.STAGES.items():
        rows = _stage_rows(workdir / folder)
        for key in ("loss", "kl"):
            got = sorted((step, value) for tag, step, value in scalars if tag == f"{stage}/{key}")
            assert got == [(r["step"], pytest.approx(r[key])) for r in rows
                           if r[key] == r[key]], (stage, key)  # TensorBoard has no NaN
