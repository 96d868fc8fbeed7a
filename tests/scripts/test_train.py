"""scripts/train.py stops a config no run can use within seconds, before building
anything: one line `error: config key ...` on stderr, exit status 2, no traceback."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(name, *args):
    """(exit status, stdout, stderr, seconds) of `python scripts/<name> args`."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    return result.returncode, result.stdout, result.stderr, time.perf_counter() - started


@pytest.mark.parametrize("config,override,key", [
    ("grpo_search.py", "--config.algo.minibatches=0", "algo.minibatches"),
    ("grpo_search.py", "--config.optim.lr=nan", "optim.lr"),
    ("grpo_search.py", "--config.log.every=0", "log.every"),
    ("grpo_search.py", "--config.init_from=/nonexistent/run", "init_from"),
    ("grpo_search.py:hf", "--config.total_steps=10", "model.path"),
])
def test_a_bad_config_is_one_error_line_naming_the_key(config, override, key, tmp_path):
    workdir = tmp_path / "run"
    status, stdout, stderr, seconds = run_script(
        "train.py", f"--config=configs/{config}", override, f"--workdir={workdir}")
    assert status == 2, stdout[-2000:] + stderr[-2000:]
    assert stderr.startswith(f"error: config key {key!r} is ") and stderr.count("\n") == 1, \
        stderr[-2000:]
    assert not workdir.exists()  # nothing was built
    assert seconds < 60


def test_a_rerun_that_changes_the_experiment_stops_before_anything_is_built(tmp_path):
    """The workdir of a run of configs/grpo_search.py:test; rerunning it with another
    lr is refused at once, naming the key, both values and the two ways out."""
    from agentjax.sweep.plan import config_of, load_config_module

    workdir = tmp_path / "run"
    (workdir / "init_model").mkdir(parents=True)
    stored = config_of(load_config_module(os.path.join(ROOT, "configs", "grpo_search.py")),
                       "test")
    (workdir / "config.json").write_text(stored.to_json_best_effort(indent=1))
    before = sorted(p.name for p in workdir.iterdir())
    status, stdout, stderr, seconds = run_script(
        "train.py", "--config=configs/grpo_search.py:test", "--config.optim.lr=0.002",
        f"--workdir={workdir}")
    assert status == 2, stdout[-2000:] + stderr[-2000:]
    assert stderr == (
        f"error: {workdir} holds a run whose config this rerun changes: optim.lr "
        f"{stored.optim.lr!r} -> 0.002. Resuming would train one run under two "
        "experiments: start it in a new --workdir, or accept the change with "
        "--allow_config_change=optim.lr\n")
    assert sorted(p.name for p in workdir.iterdir()) == before  # nothing was built
    status, _, stderr, _ = run_script(
        "train.py", "--config=configs/grpo_search.py:test", "--config.optim.lr=0.002",
        "--allow_config_change=algo.lr", f"--workdir={workdir}")
    assert status == 2 and stderr.startswith(
        "error: --allow_config_change names 'algo.lr', which is not a config key; did you "
        "mean "), stderr[-2000:]
    assert seconds < 60


def test_sigterm_stops_a_run_the_way_ctrl_c_does():
    """The run's `finally` blocks (checkpoints committed and closed, servers and
    threads stopped) run, and the exit status says SIGTERM."""
    script = os.path.join(ROOT, "scripts", "train.py")
    program = "\n".join([
        "import importlib.util, signal, time",
        f"spec = importlib.util.spec_from_file_location('train', {script!r})",
        "train = importlib.util.module_from_spec(spec)",
        "spec.loader.exec_module(train)",
        "signal.signal(signal.SIGTERM, train.stop_on_sigterm)",
        "try:",
        "    print('running', flush=True)",
        "    time.sleep(60)",
        "finally:",
        "    print('closed', flush=True)",
    ])
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                               text=True, cwd=ROOT)
    assert process.stdout.readline() == "running\n"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert (process.returncode, out) == (128 + signal.SIGTERM, "closed\n")
