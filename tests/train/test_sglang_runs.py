"""Runs whose rollouts go through SGLang's HTTP protocol (rollout.engine='sglang'):
launched local servers sample exactly what the in-process engine samples, and a run
whose servers all die saves a checkpoint, stops with one error line naming them, and
resumes to the uninterrupted run's end once servers are back."""
import json
import math
import os
import subprocess
import time

import pytest

from agentjax.sglang.launch import LocalServers
from agentjax.train.checkpoint import latest_committed_step
from agentjax.train.engines import server_flags
from agentjax.config import presets
from agentjax.config.resume import read_changes
from agentjax.train.metrics import read_metrics
from tests.train.runs import ONE_DEVICE, RL_ONLY, _argv, comparable
from tests.train.runs import train as _train

# Behavior log-probs come back through JSON from engines whose attention span is one
# token longer (server_flags): equal sampled tokens, log-probs equal within float32
# rounding. Everything else must be identical.
LOGP_ROUNDING = 1e-6


def _same_runs(reference, other, changes_at=None):
    """The two runs' metrics and reports are the same; `changes_at`: the step whose row
    says a resume changed the config (a free key, such as the server URLs)."""
    a, b = read_metrics(reference), read_metrics(other)
    assert len(a) == len(b) > 0
    for row_a, row_b in zip(comparable(a), comparable(b)):
        assert (row_b.pop("config/changes", None) is not None) == (row_b["step"] == changes_at)
        # The mismatch metrics are of those log-probs: means of log-ratios within the
        # rounding, and ratios whose logs are.
        for key in [k for k in row_a if k.startswith("logp_mismatch_")]:
            mismatch_a, mismatch_b = row_a.pop(key), row_b.pop(key)
            if key.startswith("logp_mismatch_ratio_"):
                mismatch_a, mismatch_b = math.log(mismatch_a), math.log(mismatch_b)
            assert abs(mismatch_a - mismatch_b) < LOGP_ROUNDING, key
        assert row_a == row_b
    for name in ("final.json",):
        # Timings and each process's own compile counts (an SGLang run's engine runs in
        # its servers) aside.
        final_a, final_b = (json.loads((w / name).read_text()) for w in (reference, other))
        assert comparable([final_a]) == comparable([final_b])


@pytest.mark.slow
def test_two_launched_servers_sample_what_the_in_process_engine_samples(finished_run,
                                                                         tmp_path):
    in_process, _ = finished_run("grpo_search.py:test", *RL_ONLY)
    out = _train("grpo_search.py:test", tmp_path / "sglang", *RL_ONLY,
                 "--config.rollout.engine=sglang", "--config.rollout.sglang.launch=2")
    assert "local rollout servers at http://127.0.0.1:" in out
    _same_runs(in_process, tmp_path / "sglang")
    # Step k's episodes were all sampled by weight version k (RL's start is version 1).
    rows = read_metrics(tmp_path / "sglang")
    assert [(r["rollout/weight_version_min"], r["rollout/weight_version_max"])
            for r in rows] == [(1, 1), (2, 2)]
    # Versions 1-3 exported (RL's start, after steps 1 and 2; the evaluation after step
    # 2 finds the servers holding its weights already), the last two kept.
    assert sorted(os.listdir(tmp_path / "sglang" / "weights")) == ["v00000002", "v00000003"]


@pytest.mark.slow
def test_servers_down_saves_a_checkpoint_and_the_rerun_resumes(tmp_path):
    """All servers SIGKILLed after the first RL step: the run stops with an error line
    naming the URL and a checkpoint; rerun against a new server, it ends exactly as a
    run that was never interrupted."""
    steps = ("--config.total_steps=4", "--config.eval.every=0")
    reference = tmp_path / "reference"
    _train("grpo_search.py:test", reference, *RL_ONLY, *steps)
    model = reference / "init_model"  # the same initial weights for the pool's servers
    flags = server_flags(presets.search_config("grpo", "test"))
    run = tmp_path / "run"
    common = (*RL_ONLY, *steps, f"--config.model.path={model}",
              "--config.rollout.engine=sglang", "--config.rollout.sglang.grace_s=3")

    with LocalServers.start(str(model), count=1, flags=flags) as servers:
        [url] = servers.urls
        process = subprocess.Popen(
            _argv("grpo_search.py:test", run, [*common, f"--config.rollout.sglang.urls={url}"]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ONE_DEVICE)
        deadline = time.monotonic() + 600
        while (latest_committed_step(str(run / "checkpoints")) or 0) < 1:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(servers.pids[0], 9)
        out, _ = process.communicate(timeout=600)
    assert process.returncode == 1, out[-3000:]
    [error] = [line for line in out.splitlines() if line.startswith("error: ")]
    assert url in error
    stopped_at = latest_committed_step(str(run / "checkpoints"))
    assert 1 <= stopped_at < 4

    with LocalServers.start(str(model), count=1, flags=flags) as servers:
        _train("grpo_search.py:test", run, *common,
               f"--config.rollout.sglang.urls={servers.urls[0]}")
    # The new server's URL is a free change, recorded at the step the run resumed from.
    [change] = read_changes(str(run))
    assert (change["key"], change["step"]) == ("rollout.sglang.urls", stopped_at)
    _same_runs(reference, run, changes_at=stopped_at + 1)


def test_an_unreachable_server_stops_the_run_at_startup_naming_it(tmp_path):
    url = "http://127.0.0.1:9"  # the discard port: nothing answers
    result = subprocess.run(
        _argv("grpo_search.py:test", tmp_path, [*RL_ONLY, "--config.rollout.engine=sglang",
                                                f"--config.rollout.sglang.urls={url}",
                                                "--config.rollout.sglang.startup_timeout_s=1"]),
        capture_output=True, text=True, timeout=300, env=ONE_DEVICE)
    assert result.returncode == 1
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert url in error and "/health" in error
    assert not (tmp_path / "checkpoints").exists()
