"""The experiment trackers get what the files get: every stage's rows at their steps,
once each across resumes; a broken tracker is one warning and the run goes on. Each
tracker is tested offline against what it wrote: a fake one (the calls), W&B offline
(its .wandb run files), MLflow over a `file:` store (its client), TensorBoard (its
event files). The end-to-end run: test_tracking_run.py."""
import json
import math
import os
import socket
import subprocess
import sys
import threading

import pytest

from agentjax.config import default_config
from agentjax.train.metrics import MetricsWriter, read_metrics
from agentjax.train.tracking import STATE_FILE, Table, Tracking, flat_config
from tests.train import tracker_files
from tests.train.tracker_files import FakeTracker


def _write(folder, tracking, steps, *, resume_step=0, stage="rl"):
    writer = MetricsWriter(str(folder), stage=stage, tracking=tracking, resume_step=resume_step)
    for step in steps:
        writer.write(step, {"loss": step / 10, "kl": float("nan") if step == 2 else 0.0})


def test_rows_reach_a_tracker_under_their_stage_with_their_steps(tmp_path):
    fake, warnings = FakeTracker(), []
    tracking = Tracking({"fake": fake}, workdir=str(tmp_path), log=warnings.append)
    _write(tmp_path / "sft", tracking, [1, 2], stage="sft")
    tracking.log_evaluation("sft", 2, {"sft/success_greedy": 0.25})
    _write(tmp_path, tracking, [1])
    tracking.log_report({"eval/success_sampled": 0.5}, Table(("policy",), [["RL"]]), step=1)
    tracking.close()
    metrics = [c for c in fake.calls if c[0] == "metrics"]
    assert fake.calls[0] == ("start", None) and fake.calls[-1] == ("finish", False)
    assert metrics[0] == ("metrics", "sft", 1, {"sft/loss": 0.1, "sft/kl": 0.0})
    assert metrics[1][3]["sft/loss"] == 0.2 and math.isnan(metrics[1][3]["sft/kl"])
    assert metrics[2:] == [("metrics", "sft", 2, {"sft/success_greedy": 0.25}),
                           ("metrics", "rl", 1, {"rl/loss": 0.1, "rl/kl": 0.0})]
    assert ("summary", 1, {"final/eval/success_sampled": 0.5}) in fake.calls
    assert ("table", "report", None, [["RL"]]) in fake.calls
    assert warnings == []
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state == {"fake": {"run_id": "fake-run", "where": "fake server", "done": {
        "sft": 2, "sft/eval": 2, "rl": 1, "report": 1}}}


def test_a_resumed_run_continues_the_tracker_run_without_duplicate_steps(tmp_path):
    """The first attempt logged steps 1-5 and checkpointed at 3; the rerun redoes 4-5
    (skipped: taken) and goes on to 7. A tracker turned on for the rerun gets the kept
    rows 1-3 from metrics.jsonl, then 4-7."""
    first = FakeTracker()
    tracking = Tracking({"fake": first}, workdir=str(tmp_path))
    _write(tmp_path, tracking, range(1, 6))
    tracking.log_evaluation("sft", 9, {"sft/success_greedy": 0.25})
    tracking.close(failed=True)  # killed: the checkpoint is at step 3
    again, added = FakeTracker(run_id="other"), FakeTracker(run_id="new")
    tracking = Tracking({"fake": again, "added": added}, workdir=str(tmp_path))
    _write(tmp_path, tracking, range(4, 8), resume_step=3)
    tracking.log_evaluation("sft", 9, {"sft/success_greedy": 0.25})
    tracking.close()
    assert first.steps() == [1, 2, 3, 4, 5] and first.calls[-1] == ("finish", True)
    assert again.calls[0] == ("start", "fake-run") and again.steps() == [6, 7]
    assert added.calls[0] == ("start", None) and added.steps() == list(range(1, 8))
    assert not [c for c in again.calls if c[0] == "metrics" and c[1] == "sft"]
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 8))


def test_a_tracker_somewhere_else_on_resume_starts_a_new_run_there(tmp_path):
    first, messages = FakeTracker(), []
    tracking = Tracking({"fake": first}, workdir=str(tmp_path))
    _write(tmp_path, tracking, range(1, 4))
    tracking.close()
    moved = FakeTracker(run_id="run-2", where="other server")
    tracking = Tracking({"fake": moved}, workdir=str(tmp_path), log=messages.append)
    _write(tmp_path, tracking, range(4, 6), resume_step=3)
    tracking.close()
    assert moved.calls[0] == ("start", None) and moved.steps() == [1, 2, 3, 4, 5]
    assert messages == ["fake: the run's tracker is now other server (was fake server): a "
                        "new fake run there"]
    state = json.loads((tmp_path / STATE_FILE).read_text())["fake"]
    assert (state["run_id"], state["where"], state["done"]) == ("run-2", "other server",
                                                                {"rl": 5})


def test_a_failing_tracker_is_one_warning_and_the_rest_goes_on(tmp_path):
    broken, fine, warnings = FakeTracker(fail_at=2), FakeTracker(), []
    tracking = Tracking({"broken": broken, "fine": fine}, workdir=str(tmp_path),
                        log=warnings.append)
    _write(tmp_path, tracking, range(1, 5))
    tracking.close()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: broken: ConnectionError: tracking server "
                                  "unreachable; the run goes on without broken")
    assert broken.steps() == [1] and ("finish", False) not in broken.calls
    assert fine.steps() == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_close_waits_for_a_stuck_tracker_only_so_long(tmp_path):
    stuck, warnings = FakeTracker(block=threading.Event()), []
    tracking = Tracking({"stuck": stuck}, workdir=str(tmp_path), log=warnings.append)
    _write(tmp_path, tracking, [1])
    tracking.close(timeout_s=0.1)
    assert warnings == ["warning: stuck did not finish within 0 s; what it had not sent "
                        "is in the workdir's files"]
    stuck.block.set()


def test_flat_config_has_every_key_dotted():
    flat = flat_config(default_config())
    assert flat["algo.kl_coef"] == default_config().algo.kl_coef
    assert flat["log.wandb.mode"] == "disabled" and "log.wandb" not in flat
    assert len(flat) == len(set(flat)) > 100


def _config(tmp_path, **log):
    config = default_config()
    config.log.tensorboard = False
    for key, value in log.items():
        section, _, name = key.rpartition("__")
        (config.log[section] if section else config.log)[name] = value
    return config


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B with no network and no files outside tmp_path. W&B reads the environment
    once per process (its service): torn down before and after, each test's counts."""
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.teardown()
    yield monkeypatch
    wandb.teardown()


SFT_EVAL = {"sft/success_greedy": 0.5, "sft/success_greedy/hops=1": 0.25}


def _two_attempts(config, workdir):
    """An SFT stage of 2 steps, RL steps 1-5 (checkpoint at 3, killed), then the rerun:
    SFT restored at its end, RL 4-7."""
    for sft_steps, resume_step, steps in (([1, 2], 0, range(1, 6)), ([], 3, range(4, 8))):
        tracking = Tracking.start(config, str(workdir), enabled=True, log=print)
        _write(workdir / "sft", tracking, sft_steps, stage="sft", resume_step=2 - len(sft_steps))
        tracking.log_evaluation("sft", 2, SFT_EVAL)
        _write(workdir, tracking, steps, resume_step=resume_step)
        tracking.close()


def _jsonl(folder):
    return [{k: float(v) if isinstance(v, str) else v for k, v in row.items()}
            for row in read_metrics(folder)]


def test_wandb_offline_run_holds_every_row_once_and_the_config(tmp_path, wandb_offline):
    config = _config(tmp_path, wandb__mode="offline", group="grpo_search-kl",
                     tags="arm=kl0,algo.kl_coef=0.0", name="kl0/seed0")
    workdir = tmp_path / "run"
    _two_attempts(config, workdir)
    first, resumed = tracker_files.wandb_runs(workdir)
    records = [tracker_files.wandb_run_record(r) for r in (first, resumed)]
    assert records[0]["id"] == records[1]["id"]  # one W&B run, two processes
    assert records[0]["name"] == "kl0/seed0" and records[0]["group"] == "grpo_search-kl"
    assert records[0]["tags"] == ["arm=kl0", "algo.kl_coef=0.0"]
    assert records[0]["config"] == json.loads(json.dumps(flat_config(config)))
    history = tracker_files.wandb_history(first) + tracker_files.wandb_history(resumed)
    assert tracker_files.same_rows(tracker_files.stage_rows(history, "rl"), _jsonl(workdir))
    sft_rows = tracker_files.stage_rows(history, "sft")
    assert tracker_files.same_rows([r for r in sft_rows if "loss" in r], _jsonl(workdir / "sft"))
    assert [r for r in sft_rows if "loss" not in r] == [
        {"step": 2, "success_greedy": 0.5, "success_greedy/hops=1": 0.25}]  # taken once
    assert [r["rl/step"] for r in tracker_files.wandb_history(resumed) if "rl/step" in r] == [6, 7]


def test_mlflow_file_store_run_holds_every_row_once_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the tracker would set it too
    config = _config(tmp_path, mlflow__tracking_uri=uri, group="grpo_search-kl",
                     tags="arm=kl0,algo.kl_coef=0.0")
    workdir = tmp_path / "run"
    _two_attempts(config, workdir)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("agentjax").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.info.run_name == "run"  # the workdir's folder name
    assert run.data.tags["group"] == "grpo_search-kl" and run.data.tags["algo.kl_coef"] == "0.0"
    assert run.data.params == {k: str(v) for k, v in flat_config(config).items()}
    for stage, folder in (("rl", workdir), ("sft", workdir / "sft")):
        for key in ("loss", "kl"):
            history = client.get_metric_history(run.info.run_id, f"{stage}/{key}")
            assert tracker_files.same_rows([(m.step, m.value) for m in history],
                         [(row["step"], row[key]) for row in _jsonl(folder)])
    grouped = client.get_metric_history(run.info.run_id, "sft/success_greedy.hops_1")
    assert [(m.step, m.value) for m in grouped] == [(2, 0.25)]


def test_mlflow_keys_nest_once_so_a_file_store_can_hold_every_key():
    from agentjax.train.trackers.mlflow_run import mlflow_key

    assert mlflow_key("sft/success_sampled") == "sft/success_sampled"
    assert mlflow_key("sft/success_sampled/pass@2") == "sft/success_sampled.pass_2"
    assert mlflow_key("rl/eval/success/hops=1") == "rl/eval.success.hops_1"
    assert mlflow_key("algo.kl_coef") == "algo.kl_coef" and mlflow_key("a=b") == "a_b"


def test_tensorboard_has_each_step_once_after_a_resume(tmp_path):
    config = default_config()
    workdir = tmp_path / "run"
    _two_attempts(config, workdir)
    scalars = tracker_files.tensorboard_scalars(workdir / "tb")
    loss = [(step, value) for tag, step, value in scalars if tag == "rl/loss"]
    assert loss == [(s, pytest.approx(s / 10)) for s in range(1, 8)]
    assert [step for tag, step, _ in scalars if tag == "rl/kl"] == [1, 3, 4, 5, 6, 7]  # no NaN
    assert [step for tag, step, _ in scalars if tag == "sft/loss"] == [1, 2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_servers_are_one_warning_each_and_the_files_stay_complete(
        tmp_path, wandb_offline):
    """Both trackers online to a closed port on this machine."""
    pytest.importorskip("mlflow")
    monkeypatch = wandb_offline
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    config = _config(tmp_path, wandb__mode="online", mlflow__tracking_uri=url)
    warnings = []
    tracking = Tracking.start(config, str(tmp_path), enabled=True, log=warnings.append)
    assert tracking.names == ("mlflow", "wandb")
    _write(tmp_path, tracking, range(1, 6))
    tracking.close(timeout_s=60)
    assert sorted(w.split(":")[1].strip() for w in warnings) == ["mlflow", "wandb"], warnings
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_a_process_that_does_not_write_has_no_trackers(tmp_path):
    config = _config(tmp_path, wandb__mode="offline", mlflow__tracking_uri="file:/x")
    assert Tracking.start(config, str(tmp_path), enabled=False, log=print).names == ()
    assert not os.path.exists(tmp_path / STATE_FILE)


@pytest.mark.parametrize("stage, folder", [("rl", ""), ("sft", "sft")])
def test_the_end_of_a_run_sends_the_report_and_the_exports_once(tmp_path, stage, folder):
    """log.artifacts: the final stage's HF export and, with LoRA, its adapter beside it;
    a rerun of the finished run sends neither the report nor them again."""
    from types import SimpleNamespace

    from agentjax.train.run import track_end

    for name in ("hf", "adapter"):
        (tmp_path / folder / name).mkdir(parents=True)
    config = default_config()
    config.stage, config.log.artifacts = stage, True
    results = {"eval/success_sampled": 0.5}
    fakes = []
    for _ in range(2):
        fakes.append(FakeTracker())
        runtime = SimpleNamespace(workdir=str(tmp_path), tracking=Tracking(
            {"fake": fakes[-1]}, workdir=str(tmp_path)))
        track_end(config, runtime, results, "RL agent")
    sent = [c for c in fakes[0].calls if c[0] in ("artifact", "summary")]
    last = config.sft.steps if stage == "sft" else config.total_steps
    assert sent == [("summary", last, {"final/eval/success_sampled": 0.5}),
                    ("artifact", str(tmp_path / folder / "hf"), "hf"),
                    ("artifact", str(tmp_path / folder / "adapter"), "adapter")]
    assert fakes[1].calls == [("start", "fake-run"), ("finish", False)]


@pytest.mark.parametrize("text", ["{", '{"fake": {"run_id": "x", "done": {"rl": "3"}}}', "[]"])
def test_a_broken_tracking_file_stops_the_run_at_setup_naming_it(tmp_path, text):
    (tmp_path / STATE_FILE).write_text(text)
    with pytest.raises(ValueError, match=f"{STATE_FILE}: .*delete it to start new tracker runs"):
        Tracking({"fake": FakeTracker()}, workdir=str(tmp_path))


def test_neither_tracker_package_is_imported_until_a_tracker_starts():
    code = ("import sys, agentjax.train.tracking, agentjax.train.metrics; "
            "print(sorted({'wandb', 'mlflow', 'tensorboardX'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_buffering_tracker_counts_a_step_taken_only_once_it_finished(tmp_path):
    """Killed before `finish` (no close), the steps handed to a tracker that buffers
    are not in tracking.json: the rerun sends them again (the tracker drops what its
    store holds); a synchronous one's are, as each call returned."""
    buffered, synchronous = FakeTracker(durable_on_return=False), FakeTracker()
    tracking = Tracking({"buffered": buffered, "synchronous": synchronous},
                        workdir=str(tmp_path))
    _write(tmp_path, tracking, range(1, 4))
    drained = [threading.Event() for _ in tracking._workers]
    for worker, event in zip(tracking._workers, drained):  # each took every call so far
        worker.submit(None, None, lambda tracker, event=event: event.set())
    assert all(event.wait(10) for event in drained)  # killed now: nothing finished
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["buffered"]["done"] == {} and state["synchronous"]["done"] == {"rl": 3}
    again = FakeTracker(durable_on_return=False)
    tracking = Tracking({"buffered": again}, workdir=str(tmp_path))
    _write(tmp_path, tracking, range(4, 6), resume_step=3)
    tracking.close()
    assert again.steps() == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / STATE_FILE).read_text())["buffered"]["done"] == {"rl": 5}


def _file_store_run(tmp_path, monkeypatch, steps):
    """A finished run whose MLflow is a file store under tmp_path, `steps` logged:
    (config, workdir, uri)."""
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = _config(tmp_path, mlflow__tracking_uri=uri)
    workdir = tmp_path / "run"
    tracking = Tracking.start(config, str(workdir), enabled=True, log=print)
    _write(workdir, tracking, steps)
    tracking.close()
    return config, workdir, uri


def test_mlflow_drops_what_its_store_holds_when_tracking_json_missed_it(tmp_path, monkeypatch):
    """A kill after MLflow took a row but before tracking.json recorded it: the rerun
    sends the row again and MLflow (its run's history read back) drops it; a key the
    kill kept from the store (a file store writes a batch file by file) is sent."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    config, workdir, uri = _file_store_run(tmp_path, monkeypatch, range(1, 4))
    state = json.loads((workdir / STATE_FILE).read_text())
    state["mlflow"]["done"] = {"rl": 1}
    (workdir / STATE_FILE).write_text(json.dumps(state))
    run_id = state["mlflow"]["run_id"]
    # Killed mid-batch, the file store made rl/kl's file without writing its line.
    (kl,) = (tmp_path / "mlruns").glob(f"*/{run_id}/metrics/rl/kl")
    kl.write_text("")
    warnings = []
    tracking = Tracking.start(config, str(workdir), enabled=True, log=warnings.append)
    _write(workdir, tracking, range(4, 6), resume_step=3)
    tracking.close()
    assert warnings == []
    client = MlflowClient(tracking_uri=uri)
    assert sorted(m.step for m in client.get_metric_history(run_id, "rl/loss")) == [
        1, 2, 3, 4, 5]
    assert sorted(m.step for m in client.get_metric_history(run_id, "rl/kl")) == [2, 3, 4, 5]


def test_mlflow_run_killed_while_its_file_store_rewrote_meta_yaml_is_whole_again(
        tmp_path, monkeypatch):
    """A file store rewrites a run's meta.yaml in place when its status changes (at the
    resume, at the end): killed in between, meta.yaml is empty and MLflow can neither read
    nor list the run; the rerun restores the copy saved before the rewrite."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    config, workdir, uri = _file_store_run(tmp_path, monkeypatch, range(1, 3))
    run_id = json.loads((workdir / STATE_FILE).read_text())["mlflow"]["run_id"]
    (meta,) = (tmp_path / "mlruns").glob(f"*/{run_id}/meta.yaml")
    meta.write_text("")  # killed mid-rewrite
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("agentjax").experiment_id
    with pytest.raises(AttributeError):  # what MLflow does with it: the experiment breaks
        client.search_runs([experiment])
    warnings = []
    tracking = Tracking.start(config, str(workdir), enabled=True, log=warnings.append)
    _write(workdir, tracking, range(3, 5), resume_step=2)
    tracking.close()
    assert warnings == []
    (run,) = client.search_runs([experiment])
    assert (run.info.run_id, run.info.status) == (run_id, "FINISHED")
    assert sorted(m.step for m in client.get_metric_history(run_id, "rl/loss")) == [1, 2, 3, 4]


def test_a_wandb_transaction_log_cut_anywhere_reads_as_its_first_records(
        tmp_path, wandb_offline):
    """A kill mid-write leaves a .wandb file cut short: it reads as the records before
    the cut, as wandb-core reads it (a chunk with a bad checksum is dropped)."""
    from agentjax.train.trackers.wandb_run import transaction_log

    config = _config(tmp_path, wandb__mode="offline")
    tracking = Tracking.start(config, str(tmp_path / "run"), enabled=True, log=print)
    _write(tmp_path / "run", tracking, range(1, 40))
    tracking.close()
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/*.wandb")
    data, records = path.read_bytes(), list(transaction_log(str(path)))
    assert [r.num for r in records] == list(range(1, len(records) + 1))  # none skipped
    cut = tmp_path / "cut.wandb"
    for size in range(7, len(data), 97):
        cut.write_bytes(data[:size])
        got = list(transaction_log(str(cut)))
        assert got == records[:len(got)], size
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    cut.write_bytes(bytes(damaged))
    assert len(list(transaction_log(str(cut)))) < len(records)


def test_tensorboard_event_files_cut_anywhere_read_as_their_first_scalars(tmp_path):
    from agentjax.train.trackers.tensorboard_events import scalars

    config = default_config()
    tracking = Tracking.start(config, str(tmp_path / "run"), enabled=True, log=print)
    _write(tmp_path / "run", tracking, range(1, 6))
    tracking.close()
    (path,) = (tmp_path / "run" / "tb").glob("events.out.tfevents.*")
    data, whole = path.read_bytes(), list(scalars(str(tmp_path / "run" / "tb")))
    assert [s for s in whole if s[0] == "rl/loss"] == [
        ("rl/loss", step, pytest.approx(step / 10)) for step in range(1, 6)]
    for size in range(0, len(data), 13):
        path.write_bytes(data[:size])
        got = list(scalars(str(tmp_path / "run" / "tb")))
        assert got == whole[:len(got)], size
