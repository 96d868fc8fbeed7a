"""The main job's training run (grpo_search.py:test) with every tracker on, offline: W&B and MLflow
(a `file:` store) and TensorBoard hold every metrics row of every stage at its step, the
SFT evaluation, the report, the sampled episodes and the exported policy
(tests/train/test_tracking.py tests resume and failures through the trackers alone)."""
import json
import os

import pytest

from agentjax.config import load_saved
from agentjax.train.metrics import read_metrics
from agentjax.train.trackers.mlflow_run import mlflow_key
from agentjax.train.tracking import STATE_FILE, flat_config
from tests.train import runs, tracker_files

pytestmark = pytest.mark.slow  # an end-to-end run

STAGES = {"pretrain": "pretrain", "sft": "sft", "rl": ""}  # stage -> folder in the workdir


def _jsonl(folder):
    return [{k: float(v) if isinstance(v, str) else v for k, v in row.items()}
            for row in read_metrics(folder)]


def _floats(rows):
    return json.dumps([{k: float(v) if isinstance(v, (int, float)) else v
                        for k, v in row.items()} for row in rows], sort_keys=True)


def _offline_wandb(root) -> dict:
    """The environment of a run whose W&B is offline and writes only under `root`."""
    return {**runs.ONE_DEVICE, "WANDB_MODE": "offline",
            **{name: str(root / "wandb_home") for name in
               ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("tracked")
    env = _offline_wandb(root)
    workdir = root / "run"
    out = runs.train("grpo_search.py:test", workdir, "--config.log.wandb.mode=offline",
               f"--config.log.mlflow.tracking_uri=file:{root / 'mlruns'}",
               "--config.log.tensorboard=True", "--config.log.artifacts=True",
               "--config.log.group=grpo_search-test", "--config.log.tags=arm=a,seed=0",
               env=env)
    # The config's end-to-end run (tests/train/test_run.py runs the other configs).
    runs.check_finished_run("grpo_search.py:test", workdir, out)
    return workdir


def test_wandb_has_every_stage_the_evaluations_and_the_report(workdir):
    (records,) = tracker_files.wandb_runs(workdir)
    run = tracker_files.wandb_run_record(records)
    config = load_saved(os.path.join(workdir, "config.json"))
    assert run["name"] == "run" and run["group"] == "grpo_search-test"
    assert run["tags"] == ["arm=a", "seed=0"]
    assert run["config"] == json.loads(json.dumps(flat_config(config)))
    history = tracker_files.wandb_history(records)
    for stage, folder in STAGES.items():
        rows = [r for r in tracker_files.stage_rows(history, stage) if "loss" in r]
        assert _floats(rows) == _floats(_jsonl(workdir / folder)), stage
    final = json.loads((workdir / "final.json").read_text())
    sft_eval = [r for r in history if "sft/success_greedy" in r]
    assert len(sft_eval) == 1 and sft_eval[0]["sft/success_greedy"] == final["sft/success_greedy"]
    assert sft_eval[0]["sft/step"] == config.sft.steps
    summary = tracker_files.wandb_summary(records)
    assert summary["final/eval/success_sampled"] == final["eval/success_sampled"]
    assert tracker_files.wandb_table_steps(history, "rl/samples", "rl") == [1, 2]
    assert summary["report/_type"] == "table-file"
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds.count("artifact") >= 1 and kinds[-1] == "exit"


def test_mlflow_has_every_stage_the_tables_and_the_exported_policy(workdir, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{workdir.parent / 'mlruns'}")
    state = json.loads((workdir / STATE_FILE).read_text())
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["group"] == "grpo_search-test"
    for stage, folder in STAGES.items():
        rows = _jsonl(workdir / folder)
        for key in {key for row in rows for key in row} - {"step"}:
            history = client.get_metric_history(run.info.run_id, mlflow_key(f"{stage}/{key}"))
            assert _floats([{"step": m.step, key: m.value} for m in history]) == _floats(
                [{"step": r["step"], key: r[key]} for r in rows if key in r]), (stage, key)
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "report.json", "rl", "hf"} <= files
    assert {f.path for f in client.list_artifacts(run.info.run_id, "rl")} == {
        "rl/samples_000001.json", "rl/samples_000002.json"}
    assert "hf/model.safetensors" in {f.path for f in client.list_artifacts(run.info.run_id, "hf")}


def test_tensorboard_has_every_stage_once(workdir):
    scalars = tracker_files.tensorboard_scalars(workdir / "tb")
    for stage, folder in STAGES.items():
        steps = [step for tag, step, _ in scalars if tag == f"{stage}/loss"]
        assert steps == [r["step"] for r in read_metrics(workdir / folder)], stage


@pytest.fixture(scope="module")
def killed_in_rl(tmp_path_factory):
    """The same run SIGKILLed (its process group and W&B's service) once RL logged its
    first row, then resumed to the end."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("killed_in_rl")
    env = _offline_wandb(root)
    workdir = root / "run"
    overrides = ("--config.log.wandb.mode=offline",
                 f"--config.log.mlflow.tracking_uri=file:{root / 'mlruns'}",
                 "--config.log.tensorboard=True")
    runs.kill_when("grpo_search.py:test", workdir, *overrides, env=env, tree=True,
                   when=lambda w: os.path.exists(os.path.join(w, "metrics.jsonl"))
                   and len(read_metrics(w)) >= 1)
    out = runs.train("grpo_search.py:test", workdir, *overrides, env=env)
    return workdir, [line for line in out.splitlines() if "warning: " in line]


def _comparable_rows(rows):
    return _floats(runs.comparable(rows))


def test_a_run_killed_in_rl_has_every_row_once_in_every_tracker(killed_in_rl, monkeypatch):
    from mlflow.tracking import MlflowClient

    workdir, warnings = killed_in_rl
    assert not [w for w in warnings if "wandb" in w or "mlflow" in w], warnings
    files = tracker_files.wandb_runs(workdir)
    assert len(files) == 2
    history = [row for records in files for row in tracker_files.wandb_history(records)]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{workdir.parent / 'mlruns'}")
    run_id = json.loads((workdir / STATE_FILE).read_text())["mlflow"]["run_id"]
    scalars = tracker_files.tensorboard_scalars(workdir / "tb")
    for stage, folder in STAGES.items():
        rows = _jsonl(workdir / folder)
        got = [r for r in tracker_files.stage_rows(history, stage) if "loss" in r]
        assert _comparable_rows(got) == _comparable_rows(rows), stage
        mlflow = client.get_metric_history(run_id, mlflow_key(f"{stage}/loss"))
        assert sorted((m.step, m.value) for m in mlflow) == [
            (r["step"], pytest.approx(r["loss"])) for r in rows], stage
        tensorboard = sorted((step, v) for tag, step, v in scalars if tag == f"{stage}/loss")
        assert tensorboard == [(r["step"], pytest.approx(r["loss"])) for r in rows], stage
