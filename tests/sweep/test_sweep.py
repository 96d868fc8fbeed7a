"""Sweeps: expansion, flags that absl parses back, local runs (parallel, failure
isolation, resume), the report's numbers and plots, and --print-commands."""
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from agentjax.config import resume
from agentjax.sweep import cli, launch, plan
from agentjax.sweep import report as sweep_report

REPO = Path(__file__).resolve().parents[2]
SEEDS = [0, 1, 2]
KL = {"kl0": 0.0, "kl.5": 0.5}  # arm -> algo.kl_coef

CONFIG = textwrap.dedent('''
    import ml_collections

    def get_config(arg=None):
        c = ml_collections.ConfigDict()
        c.seed = 0
        c.variant = arg or "default"
        c.data = ml_collections.ConfigDict({"world_seed": 0, "train_hops": (1, 2)})
        c.algo = ml_collections.ConfigDict({"kl_coef": 0.001, "kl_kind": "k3"})
        c.rollout = ml_collections.ConfigDict({"group_size": 8, "mask": True})
        c.lock()
        return c

    SWEEPS = {
        "kl": [{"name": "kl0", "overrides": {"algo.kl_coef": 0.0}},
               {"name": "kl.5", "overrides": {"algo.kl_coef": 0.5}}],
        "unknown_key": [{"name": "a", "overrides": {"algo.kl_coeff": 0.0}}],
        "wrong_type": [{"name": "a", "overrides": {"rollout.group_size": "four"}}],
        "duplicate": [{"name": "a", "overrides": {}}, {"name": "a", "overrides": {}}],
        "bad_name": [{"name": "a/b", "overrides": {}}],
        "no_overrides": [{"name": "a"}],
        "seed_clash": [{"name": "a", "overrides": {"seed": 3}}],
        "empty": [],
    }

    def sweep(name):
        return SWEEPS[name]
''')

# Writes metrics/final numbers that are simple functions of (seed, kl), so the test can
# compute the report by hand; (kl=0.5, seed=1) crashes after logging two steps, kl=0.5
# never reports eval/success_greedy.
FAKE_TRAIN = textwrap.dedent('''
    import argparse, json, os, sys, time
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--workdir")
    args, rest = parser.parse_known_args()
    flags = dict(a[len("--config."):].split("=", 1) for a in rest)
    seed, kl = int(flags["seed"]), float(flags["algo.kl_coef"])
    assert flags["data.world_seed"] == flags["seed"]
    start = time.time()
    print("fake train", args.config, seed, kl)
    with open(os.path.join(args.workdir, "metrics.jsonl"), "w") as f:
        for step in (1, 2, 3):
            if kl == 0.5 and seed == 1 and step == 3:
                f.write('{"step": 3, "rew')  # killed mid-line
                f.flush()
                sys.exit(3)
            row = {"step": step, "reward/mean": seed ** 2 + 10 * kl + step, "entropy": 1.0}
            if step > 1:
                row["eval/success_sampled"] = 0.1 * seed + kl + 0.01 * step
            f.write(json.dumps(row) + "\\n")
    time.sleep(0.4)  # long enough for two parallel runs to overlap
    final = {"eval/success_sampled": 0.1 * seed + kl, "kl_ref": "nan"}
    if kl == 0.0:
        final["eval/success_greedy"] = 0.2 * seed
    with open(os.path.join(args.workdir, "final.json"), "w") as f:
        json.dump(final, f)
    with open(os.path.join(args.workdir, "times.json"), "w") as f:
        json.dump([start, time.time()], f)
''')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    (root / "fake_config.py").write_text(CONFIG)
    (root / "fake_train.py").write_text(FAKE_TRAIN)
    return root


def _argv(files, *more):
    return ["--config", str(files / "fake_config.py"), "--sweep", "kl", "--seeds", "0,1,2",
            "--out", str(files / "out"), "--train-script", str(files / "fake_train.py"), *more]


@pytest.fixture(scope="module")
def swept(files):
    """One local sweep, 2 runs at a time: (exit code, stdout, runs)."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(_argv(files, "--parallel", "2"))
    arms, _ = plan.load_arms(str(files / "fake_config.py"), "kl")
    return code, stdout.getvalue(), plan.expand(arms, SEEDS, str(files / "out"))


def test_expand_arms_times_seeds(files):
    arms, config = plan.load_arms(f"{files / 'fake_config.py'}:big", "kl")
    assert config.variant == "big"
    runs = plan.expand(arms, [0, 7], "out")
    assert [r.name for r in runs] == ["kl0/seed0", "kl0/seed7", "kl.5/seed0", "kl.5/seed7"]
    assert runs[1].workdir == os.path.join("out", "kl0", "seed7")
    assert runs[3].overrides == {"algo.kl_coef": 0.5, "seed": 7, "data.world_seed": 7}
    argv = plan.train_command(runs[1], "c.py:big", train_script="t.py", python="py",
                               extra_args=["--config.total_steps=5"])
    assert argv == ["py", "t.py", "--config", "c.py:big", "--workdir", runs[1].workdir,
                    "--config.algo.kl_coef=0.0", "--config.seed=7",
                    "--config.data.world_seed=7", "--config.total_steps=5"]


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # ml_collections
def test_override_flags_parse_back_through_absl_config_flags(files):
    overrides = {"algo.kl_coef": 1e-05, "rollout.group_size": 16, "rollout.mask": False,
                 "algo.kl_kind": "k1 'quoted' text", "data.train_hops": (1, 2, 3),
                 "variant": "x=y"}
    argv = ["prog", "--config", f"{files / 'fake_config.py'}:v",
            *plan.override_flags(overrides)]
    assert shlex.split(plan.shell_command(argv)) == argv  # survives the shell too
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    for key, value in overrides.items():
        got = flag_values.config
        for name in key.split("."):
            got = got[name]
        assert got == value and type(got) is type(value), (key, got)
    with pytest.raises(ValueError, match="dict"):
        plan.format_value({"a": 1})


@pytest.mark.parametrize("name, message", [
    ("unknown_key", "arm 'a'.*unknown config key 'algo.kl_coeff'"),
    ("wrong_type", "arm 'a'.*'rollout.group_size'"),
    ("duplicate", "'a' appears twice"),
    ("bad_name", "'a/b' must match"),
    ("no_overrides", "exactly 'name' and 'overrides'"),
    ("empty", "non-empty list"),
    ("nope", "sweep 'nope'.*nope"),
])
def test_bad_sweeps_name_the_problem(files, name, message):
    with pytest.raises(ValueError, match=message):
        plan.load_arms(str(files / "fake_config.py"), name)


def test_bad_arguments_name_the_problem(files):
    arms, _ = plan.load_arms(str(files / "fake_config.py"), "seed_clash")
    with pytest.raises(ValueError, match=r"arm 'a' overrides \['seed'\]"):
        plan.expand(arms, [0], "out")
    with pytest.raises(ValueError, match="no such file"):
        plan.load_arms(str(files / "missing.py"), "kl")
    (files / "no_sweep.py").write_text("def get_config(arg=None):\n    return None\n")
    no_world_seed = CONFIG.replace('"world_seed": 0, ', "")
    (files / "no_world_seed.py").write_text(no_world_seed)
    with pytest.raises(ValueError, match="seed axis.*'data.world_seed'"):
        plan.load_arms(str(files / "no_world_seed.py"), "kl")
    with pytest.raises(ValueError, match="no sweep"):
        plan.load_arms(str(files / "no_sweep.py"), "kl")
    for bad in ("0,x", "1,1", ""):
        with pytest.raises(ValueError, match="--seeds"):
            plan.parse_seeds(bad)
    assert plan.parse_seeds("3, 1") == [3, 1]


def test_failed_run_is_isolated_and_reported(swept):
    code, stdout, runs = swept
    assert code == 1  # a run failed
    assert "kl.5/seed1: failed (exit 3)" in stdout
    for run in runs:
        log = Path(run.workdir, "stdout.log").read_text()
        assert "fake train" in log and "--config.seed=" in log  # command + output captured
        assert launch.is_finished(run) == (run.name != "kl.5/seed1")


def test_runs_overlap_with_parallel_two(swept):
    _, _, runs = swept
    spans = sorted(json.loads(Path(r.workdir, "times.json").read_text())
                   for r in runs if launch.is_finished(r))
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))


def test_resume_reruns_only_unfinished(files, swept):
    _, _, runs = swept
    before = {r.name: os.path.getmtime(Path(r.workdir, "stdout.log")) for r in runs}
    status = launch.run_all(
        runs, lambda run: plan.train_command(run, str(files / "fake_config.py"),
                                              train_script=str(files / "fake_train.py")),
        log=lambda line: None)
    assert status == {r.name: "failed (exit 3)" if r.name == "kl.5/seed1"
                      else "skipped (finished)" for r in runs}
    after = {r.name: os.path.getmtime(Path(r.workdir, "stdout.log")) for r in runs}
    assert [name for name in before if after[name] != before[name]] == ["kl.5/seed1"]


def _mean_std(values):
    return f"{np.mean(values):.4g} ± {np.std(values, ddof=1):.4g}"


def test_report_numbers(files, swept):
    _, stdout, _ = swept
    report = (files / "out" / "report.md").read_text()
    sampled0 = [0.1 * s for s in SEEDS]
    sampled5 = [0.1 * s + 0.5 for s in (0, 2)]  # seed 1 crashed
    greedy0 = [0.2 * s for s in SEEDS]
    rows = [f"| kl0 | 0,1,2 | {_mean_std(sampled0)} | {_mean_std(greedy0)} |",
            f"| kl.5 | 0,1,2 | {_mean_std(sampled5)} (n=2/3) | failed/missing |",
            f"| kl0 | 2 | finished | {0.2:.4g} | {0.4:.4g} |",
            "| kl.5 | 1 | failed | failed | failed |",
            f"| kl.5 | 2 | finished | {0.7:.4g} | missing |"]
    for row in rows:
        assert row in report and row in stdout, row


def test_report_curves(files, swept):
    _, _, runs = swept
    arms = sweep_report.by_arm(runs)
    # reward/mean = seed**2 + 10 kl + step; kl.5/seed1 logged steps 1-2 only.
    steps, mean, low, high = sweep_report.arm_curve(arms["kl0"], "reward/mean")
    assert steps == [1, 2, 3]
    np.testing.assert_allclose(mean, [5 / 3 + 1, 5 / 3 + 2, 5 / 3 + 3])
    np.testing.assert_allclose(low, [1, 2, 3])
    np.testing.assert_allclose(high, [5, 6, 7])
    steps, mean, low, high = sweep_report.arm_curve(arms["kl.5"], "reward/mean")
    assert steps == [1, 2, 3]
    np.testing.assert_allclose(mean, [5 / 3 + 6, 5 / 3 + 7, (8 + 12) / 2],
                               err_msg="step 3 averages seeds 0 and 2 only")
    assert sweep_report.arm_curve(arms["kl0"], "no/such") is None
    report = (files / "out" / "report.md").read_text()
    for metric in sweep_report.DEFAULT_CURVES:
        png = files / "out" / sweep_report.plot_file_name(metric)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
        assert f"]({png.name})" in report


def test_report_of_pending_and_unreadable_runs(tmp_path):
    runs = plan.expand([{"name": "a", "overrides": {}}], [0, 1, 2], str(tmp_path))
    os.makedirs(runs[0].workdir)
    Path(runs[0].workdir, "final.json").write_text('{"eval/success_sampled": "nan"}')
    os.makedirs(runs[1].workdir)
    Path(runs[1].workdir, "final.json").write_text('{"eval/success')  # torn write
    Path(runs[1].workdir, "metrics.jsonl").write_text('{"step": 1, "reward/mean": 2}\n')
    tables = sweep_report.write_report(runs, str(tmp_path), title="t", metrics=["eval/success_sampled"],
                                curves=["reward/mean", "eval/success_sampled"])
    assert "| a | 0,1,2 | nan (n=1/3) |" in tables
    assert "| a | 1 | failed | failed |" in tables and "| a | 2 | pending | pending |" in tables
    assert (tmp_path / "curve_reward_mean.png").exists()
    assert not (tmp_path / "curve_eval_success_sampled.png").exists()
    assert "No run logged `eval/success_sampled`." in (tmp_path / "report.md").read_text()


def test_print_commands(files, swept):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep.py"),
                          *_argv(files, "--print-commands", "--", "--config.total_steps=9")],
                         capture_output=True, text=True, timeout=60, check=True)
    _, _, runs = swept
    (failed,) = [r for r in runs if not launch.is_finished(r)]
    expected = plan.train_command(failed, str(files / "fake_config.py"),
                                   train_script=str(files / "fake_train.py"),
                                   extra_args=["--config.total_steps=9"])
    assert out.stdout.splitlines() == [plan.shell_command(expected)]
    assert "5 finished run(s) left out" in out.stderr

    fresh = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep.py"),
                            *_argv(files, "--print-commands", "--out", str(files / "fresh"))],
                           capture_output=True, text=True, timeout=60, check=True)
    lines = fresh.stdout.splitlines()
    assert len(lines) == 6 and all("--config.algo.kl_coef=" in line for line in lines)
    assert not (files / "fresh").exists()  # printing runs nothing


def test_an_arm_setting_a_renamed_key_names_the_new_one():
    from agentjax.config import default_config
    with pytest.raises(ValueError, match="'env.mask_observations' was renamed: use "
                                         "env.loss_on_observations"):
        plan.set_dotted(default_config(), "env.mask_observations", False)


TRACKED_CONFIG = textwrap.dedent('''
    from agentjax.config import default_config

    def get_config(arg=None):
        return default_config()

    def sweep(name):
        return [{"name": "kl0", "overrides": {"algo.kl_coef": 0.0}},
                {"name": "hops", "overrides": {"algo.kl_coef": 0.5,
                                               "data.train_questions": "1:2,2:3"}}]
''')


def test_a_sweeps_arms_share_a_tracker_group_and_are_tagged_by_their_values(tmp_path):
    """The commands set log.name/group/tags; the MLflow runs they make (a `file:` store,
    the runs' trackers started as train.py would) share the group."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from agentjax.train.tracking import Tracking

    config_file = tmp_path / "tracked.py"
    config_file.write_text(TRACKED_CONFIG)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["--config", str(config_file), "--sweep", "kl", "--seeds", "3",
                         "--out", str(tmp_path / "out"), "--print-commands"]) == 0
    commands = [shlex.split(line) for line in stdout.getvalue().splitlines()]
    flags_of = [dict(a[len("--config."):].split("=", 1) for a in argv if a.startswith("--config."))
                for argv in commands]
    assert [f["log.name"] for f in flags_of] == ["kl0/seed3", "hops/seed3"]
    assert {f["log.group"] for f in flags_of} == {"tracked-kl"}
    assert [f["log.tags"] for f in flags_of] == [
        "arm=kl0,algo.kl_coef=0.0,seed=3",
        "arm=hops,algo.kl_coef=0.5,data.train_questions=1:2;2:3,seed=3"]
    uri = f"file:{tmp_path / 'mlruns'}"
    arms, config = plan.load_arms(str(config_file), "kl")
    warnings = []
    for run in plan.expand(arms, [3], str(tmp_path / "out")):
        for key, value in {**run.overrides, **plan.tracking_overrides(config, "tracked-kl", run),
                           "log.tensorboard": False, "log.mlflow.tracking_uri": uri}.items():
            plan.set_dotted(config, key, value)
        os.makedirs(run.workdir)
        tracking = Tracking.start(config, run.workdir, enabled=True, log=warnings.append)
        tracking.log_row("rl", 1, {"loss": 0.5})
        tracking.close()
    assert warnings == []
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("agentjax").experiment_id],
                              "tags.group = 'tracked-kl'")
    assert sorted((r.info.run_name, r.data.tags["arm"], r.data.tags["algo.kl_coef"])
                  for r in runs) == [("hops/seed3", "hops", "0.5"), ("kl0/seed3", "kl0", "0.0")]


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # ml_collections
def test_a_sweep_rerun_of_an_arm_resumes_its_run_with_no_config_change(tmp_path):
    """Each arm's command gives the config its run saved, read back through
    config.json: the rerun resumes, with nothing to refuse or record."""
    config_arg = f"{REPO / 'configs' / 'grpo_search.py'}:test"
    arms, _ = plan.load_arms(config_arg, "algorithm")
    for run in plan.expand(arms, [3], str(tmp_path)):

        def parsed():
            argv = plan.train_command(run, config_arg)[1:]
            flag_values = flags.FlagValues()
            config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
            flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
            flag_values(argv)
            return flag_values.config

        os.makedirs(os.path.join(run.workdir, "init_model"))  # work began
        Path(run.workdir, "config.json").write_text(parsed().to_json_best_effort(indent=1))
        assert resume.check_resume(parsed(), run.workdir) == [], run.name
