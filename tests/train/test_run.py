"""End-to-end runs of every config (tiny `:test` variants), evaluation and export of a
finished run (resume after SIGKILL: test_resume.py)."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.envs.search import demonstrators as demo_lib
from agentjax.models.hf import make_tiny_hf
from agentjax.models.tokenizer import load_tokenizer
from agentjax.rewards.composite import make_reward_fn
from agentjax import config as config_lib
from agentjax.config import checks, schema
from agentjax.config import presets
from agentjax.train import update as step_lib
from agentjax.train.run import set_up
from agentjax.train.stages import rl as rl_loop
from agentjax.train.stages import sft
from agentjax.envs import registry as suites
from agentjax.train.metrics import read_metrics
from agentjax.train.policy import EXPORT_MARKER
from tests.envs.search import search_r1_files
from tests.models.qwen_tokenizers import qwen_tokenizer_folder
from tests.rewards.episodes import TWO_HOP, episode
from tests.train.runs import (ONE_DEVICE, RL_ONLY, ROOT, TRAIN, check_finished_run,
                              comparable, with_devices)
from tests.train.runs import train as _train

FOUR_DEVICES = with_devices(4)


@pytest.mark.slow
# grpo_search.py:test runs in tests/train/test_tracking_run.py, with every tracker on.
@pytest.mark.parametrize("config", ["ppo_search.py:test", "dapo_search.py:test",
                                    "sft_search.py:test", "grpo_python.py:test",
                                    "grpo_code.py:test", "grpo_tools.py:test",
                                    "grpo_python_agent.py:test"])
def test_every_config_runs_end_to_end(config, tmp_path):
    check_finished_run(config, tmp_path, _train(config, tmp_path))


@pytest.mark.slow
def test_trains_on_search_r1_files(tmp_path):
    """Search-R1's own merged NQ + HotpotQA parquet and wiki-style corpus: every row
    loads, no episode fails, and the reward (EM, F1, tool shaping; the process reward
    needs subgoals these tasks lack) scores every episode. The prompt is the short
    instruction (data.file_prompt=False): Search-R1's own would only lengthen the run
    (the suite tests check that it reaches the agent)."""
    train, corpus = str(tmp_path / "train.parquet"), str(tmp_path / "corpus.jsonl")
    search_r1_files.write_merged_train(train)
    search_r1_files.write_corpus(corpus)
    workdir = tmp_path / "run"
    _train("grpo_search.py:test", workdir, "--config.data.source=files",
           f"--config.data.train_path={train}", f"--config.data.test_path={train}",
           f"--config.data.corpus_path={corpus}", "--config.sft.steps=0",
           "--config.pretrain.steps=0", "--config.reward.tool_weight=0.1",
           "--config.data.file_prompt=False", "--config.eval.every=0")
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["stop/failed"] == 0
        assert "reward/exact_match" in row and "reward/f1" in row
        assert "reward/process" not in row
        # Tool shaping scores every episode: a failed one would be rewarded 0.
        assert row["reward/tool_shaping"] != 0 and row["reward/mean"] != 0
    final = json.loads((workdir / "final.json").read_text())
    assert final["eval/failed"] == 0


@pytest.mark.slow
def test_engine_lanes_give_the_same_run(tmp_path):
    """Deterministic sampling does not depend on the lane a request lands in, and each
    lane has the program shapes of a one-lane engine of its slots: same metrics (RL
    alone: pretraining and SFT sample nothing)."""
    out = {}
    for lanes, slots in ((1, 4), (2, 8)):
        _train("grpo_search.py:test", tmp_path / f"lanes{lanes}", *RL_ONLY,
               f"--config.rollout.engine_lanes={lanes}",
               f"--config.rollout.engine_slots={slots}", "--config.rollout.concurrency=4")
        out[lanes] = comparable(read_metrics(tmp_path / f"lanes{lanes}"))
    assert out[1] == out[2]


@pytest.mark.slow
def test_sharded_run_matches_one_device(finished_run, tmp_path):
    # The one-device side: the shared run's pretraining and SFT, which RL's step count
    # and evaluation cadence do not touch. 4 rows per RL step, 8 per pretraining and SFT
    # step: divisible by data x fsdp = 4.
    one_device, _ = finished_run("grpo_search.py:test")
    _train("grpo_search.py:test", tmp_path / "four", "--config.total_steps=1",
           "--config.eval.every=0", "--config.mesh.data=2", "--config.mesh.fsdp=2",
           env=FOUR_DEVICES)
    for stage in ("pretrain", "sft"):
        one, four = (read_metrics(run / stage) for run in (one_device, tmp_path / "four"))
        for a, b in zip(one, four, strict=True):
            for key in ("nll", "grad_norm", "entropy"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (stage, key)
    [rl] = read_metrics(tmp_path / "four")
    assert rl["mask/leak"] == 0 and np.isfinite(rl["grad_norm"])


# The main job's `test` variant, a fresh process: its engine plans 8 programs (a
# deterministic engine of 8 rows: prefill at 4 rows x 3 chunks, one item count each;
# decode at 8 rows x 8, 16, 32 and 48 items; a page copy: 3 + 4 + 1) and its episodes
# reached 6; the trainer's programs (the update, prepare, the initialisers and eager ops
# around them) were 46. 57 before prefill had one item count per row count.
MAIN_JOB_BUDGET = {"engine": 8, "all": 46 + 8}


@pytest.mark.slow
def test_the_main_job_compiles_within_its_budget(finished_run):
    workdir, out = finished_run("grpo_search.py:test")
    final = json.loads((workdir / "final.json").read_text())
    engine = sum(final.get(f"compile/{name}", 0) for name in ("prefill", "decode",
                                                               "copy_pages"))
    assert 0 < engine <= MAIN_JOB_BUDGET["engine"]
    assert final["compile/programs"] <= MAIN_JOB_BUDGET["all"]
    assert f"compiled {final['compile/programs']} programs: " in out


def _script(name, *args):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args],
                            capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env=ONE_DEVICE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_evaluate_and_export_a_finished_run(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run("grpo_search.py:test")[0], run)
    # A run saved by another version: a key since removed, a key added since.
    saved = json.loads((run / "config.json").read_text())
    saved["algo"]["value_coef"] = 0.5
    del saved["sft"]["rename_frac"]
    (run / "config.json").write_text(json.dumps(saved))
    out = _script("evaluate.py", f"--workdir={run}", "--num_tasks=4", "--samples=2")
    assert "no longer has, ignored: algo.value_coef" in out
    evaluated = json.loads((run / "evaluate" / "test.json").read_text())
    assert "test/success_greedy" in evaluated and "test/success_sampled/pass@2" in evaluated
    assert any(k.startswith("test/success_sampled/taught=") for k in evaluated)
    assert "test/success_greedy" in out
    # A folder of one's own is never replaced by an export.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "export_hf.py"),
                              f"--workdir={run}", f"--out={tmp_path / 'mine'}"],
                             capture_output=True, text=True, timeout=600, cwd=ROOT,
                             env=ONE_DEVICE)
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"error: --out={tmp_path / 'mine'}: an export replaces its folder as a whole, and "
        f"{tmp_path / 'mine'} holds notes.txt and is no earlier export"), refused.stderr
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    _script("export_hf.py", f"--workdir={run}", f"--out={tmp_path / 'hf'}", "--step=1")
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert (tmp_path / "hf" / "tokenizer.json").exists()
    marker = json.loads((tmp_path / "hf" / EXPORT_MARKER).read_text())
    assert (marker["workdir"], marker["step"]) == (str(run), 1)


def test_load_saved_config_keeps_known_keys_and_names_the_dropped_ones(tmp_path, capsys):
    config = presets.search_config("grpo", "test")
    saved = config.to_dict()
    saved["algo"]["value_coef"], saved["gone"] = 0.5, {"x": 1}
    del saved["sft"]["rename_frac"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    loaded = config_lib.load_saved(str(path))
    assert "no longer has, ignored: algo.value_coef, gone" in capsys.readouterr().out
    assert loaded.to_dict() == config.to_dict()


def test_every_config_key_is_read_outside_the_config_module():
    """A key that only config.py mentions is a knob that silently does nothing (as
    reward.outcome and algo.value_coef were)."""
    not_yet_used = set()
    defined = {schema.__file__, checks.__file__}  # where keys are defined and checked
    sources = []
    for folder in ("agentjax", "scripts", "configs"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            sources += [pathlib.Path(dirpath, n).read_text() for n in names
                        if n.endswith(".py") and os.path.join(dirpath, n) not in defined]
    text = "\n".join(sources)
    unread = [key for key in config_lib.RULES
              if not re.search(r"[.\"']" + re.escape(key.split(".")[-1]) + r"\b", text)]
    assert sorted(unread) == sorted(not_yet_used)


def test_reward_outcome_selects_the_rewarded_component():
    half_right = episode(TWO_HOP, "<answer> Dara Kessin </answer>")
    config = config_lib.default_config()
    for outcome, total_expected in (("em", 0.0), ("f1", 0.5)):
        config.reward.outcome = outcome
        reward_fn = make_reward_fn(suites.reward_config(
            config, process=config.reward.process_weight))
        total, parts = reward_fn(TWO_HOP, half_right)
        # Both outcomes are logged; success (exact_match) does not depend on the choice.
        assert parts["exact_match"] == 0.0 and parts["f1"] == pytest.approx(0.5)
        assert total == pytest.approx(total_expected)


def test_renamed_demonstrations_change_sft_data_not_the_tokenizer_texts(tmp_path):
    config = presets.search_config("grpo", "test")
    config.data.train_questions = "1:40,2:40"
    plain = suites.build_suite(config, str(tmp_path / "plain"))
    config.sft.rename_frac = 1.0
    renamed = suites.build_suite(config, str(tmp_path / "renamed"))
    assert renamed.texts == plain.texts
    flags = [d.task.metadata.get("renamed", False) for d in renamed.demonstrations]
    assert 0 < sum(flags) < len(flags)
    for was, now, flag in zip(plain.demonstrations, renamed.demonstrations, flags):
        assert (now.turns != was.turns) == flag and now.task.task_id == was.task.task_id
    # Renamed episodes teach no fact of the world: only the others mark questions taught.
    kept = [d for d, flag in zip(plain.demonstrations, flags) if not flag]
    facts = demo_lib.taught_facts(kept)
    assert [t.metadata["taught"] for t in renamed.test_tasks] == [
        demo_lib.mark_taught(t, facts).metadata["taught"] for t in plain.test_tasks]
    assert [t.task_id for t in renamed.train_tasks] == [t.task_id for t in plain.train_tasks]


def test_lr_schedule_spans_every_optimizer_update_of_the_run():
    config = presets.search_config("grpo", "test")
    config.total_steps, config.algo.minibatches, config.algo.ppo_epochs = 5, 2, 3
    updates = rl_loop.optimizer_updates(config)
    assert updates == 30
    optimizer = step_lib.make_optimizer(1.0, total_steps=updates, schedule="cosine")
    params = {"w": jnp.zeros(())}
    state = optimizer.init(params)
    moved = []
    for _ in range(updates):
        update, state = optimizer.update({"w": jnp.ones(())}, state, params)
        moved.append(abs(float(update["w"])))
    # The warmup's first update is 0; the cosine reaches 0 only after the last update.
    assert moved[0] == 0 and all(m > 0 for m in moved[1:])
    assert moved[1] > moved[15] > moved[-1]


def test_bad_override_fails_before_anything_runs(tmp_path):
    argv = [sys.executable, TRAIN, f"--config={ROOT}/configs/grpo_search.py:test",
            f"--workdir={tmp_path}", "--config.rollout.grup_size=4"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=ONE_DEVICE)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: unknown config key 'rollout.grup_size'; did "
                                     "you mean 'group_size'?")
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_sft_with_a_real_qwen_template_trains_the_end_of_turn_token(tmp_path):
    """A Qwen3 base checkpoint (eos <|endoftext|>; its template ends turns with
    <|im_end|>) with thinking off: SFT's python-tool demonstrations set up, every
    demonstrated turn ends with a trained <|im_end|>, the engine stops on it, and the
    export keeps the checkpoint's tokenizer files. (The SFT steps themselves are the
    end-to-end runs' `sft` stage; compiling them here would cost a minute.)"""
    source = qwen_tokenizer_folder(tmp_path / "tokenizer", "qwen3", "base", "hub")
    make_tiny_hf(tmp_path / "model", tokenizer=load_tokenizer(source), hidden_size=32,
                 intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    config = presets.python_config("grpo", "test")
    config.model.path = str(tmp_path / "model")
    config.tokenizer.template_kwargs = '{"enable_thinking": false}'
    config.sft.steps = 1
    config.devices = 1  # nothing here is about sharding
    runtime, suite, policy, rollouts = set_up(config, str(tmp_path / "run"))
    try:
        tokenizer = policy.tokenizer
        im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
        assert {im_end, endoftext} <= set(rollouts.engine.lanes[0].eos_token_ids)
        demos = sft.demonstration_trajectories(suite, tokenizer, config.rollout.max_tokens,
                                               runtime.log)
        assert demos
        for demo in demos:
            assert tokenizer.decode(demo.prompt_ids).endswith("<think>\n\n</think>\n\n")
            for turn in demo.turns:
                assert turn.action_ids[-1] == im_end and turn.trainable
        policy.export(policy.params, str(tmp_path / "run" / "sft" / "hf"))
    finally:
        rollouts.close()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "run" / "sft" / "hf" / name).read_bytes() == \
            (source / name).read_bytes()
