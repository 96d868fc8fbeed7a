"""The code suite: the synthetic world with its scripted demonstrator, and a user's
HumanEval / MBPP files whose canonical solutions become SFT demonstrations and whose bad
rows stop the run before any training (or are skipped, counted)."""
import copy

import numpy as np
import pytest

from agentjax.core.trajectory import Trajectory
from agentjax.envs.code import world as code_world
from agentjax.envs import sandbox as sandbox_lib
from agentjax.envs.registry import build_suite
from agentjax.models.tokenizer import load_tokenizer
from agentjax.sweep import plan
from tests.envs.code.code_files import HUMANEVAL, MBPP, write_jsonl
from tests.models.qwen_tokenizers import qwen_tokenizer_folder

pytestmark = pytest.mark.skipif(sandbox_lib.shutil.which("bwrap") is None,
                                reason="bubblewrap missing: apt-get install -y bubblewrap")


def config_of(**overrides):
    config = plan.load_config_module("configs/grpo_code.py").get_config("test")
    for key, value in overrides.items():
        plan.set_dotted(config, key, value)
    return config


def test_synthetic_world_suite(tmp_path):
    suite = build_suite(config_of(), str(tmp_path))
    assert (len(suite.train_tasks), len(suite.test_tasks)) == (24, 4)
    assert len(suite.demonstrations) == 24 and suite.success_key == "all_tests_pass"
    assert 0.0 <= suite.baselines["demonstrator"]["success"] <= 1.0
    # Guessing episodes submit at once; solving ones run first.
    kinds = {len(d.turns) for d in suite.demonstrations}
    assert 1 in kinds and kinds & {2, 3}
    for demo in suite.demonstrations:
        if len(demo.turns) > 1:
            assert demo.turns[0].action.startswith('<tool_call>{"name": "run"')
            assert " tests passed." in demo.turns[0].observation
        assert demo.turns[-1].action.startswith("```python\ndef f(x): return ")
        assert demo.turns[-1].observation is None


def test_the_world_depth_and_the_failures_shown_reach_the_suite(tmp_path):
    suite = build_suite(config_of(**{"data.code_depth": 1, "env.failures_shown": 1,
                                     "sft.wrong_first_prob": 1.0, "sft.guess_prob": 0.0}),
                        str(tmp_path))
    assert {t.metadata["expression"] for t in suite.train_tasks + suite.test_tasks} <= set(
        code_world.language(1))
    reports = [d.turns[0].observation for d in suite.demonstrations if len(d.turns) == 3]
    assert reports and all(r.count("FAILED") == 1 for r in reports)
    assert any("more failed)" in r for r in reports)


def test_files_suite_canonical_demonstrations(tmp_path):
    train = write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    test = write_jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    config = config_of(**{"data.source": "files", "data.train_path": train,
                          "data.test_path": test, "env.instruction": "short"})
    suite = build_suite(config, str(tmp_path / "data"))
    assert [t.task_id for t in suite.train_tasks] == ["2", "3", "17"]
    assert [t.task_id for t in suite.test_tasks] == ["HumanEval/0", "HumanEval/23", "HumanEval/53"]
    assert suite.baselines == {}
    demo = suite.demonstrations[0]
    assert demo.messages[0]["role"] == "system" and '"name": "run"' in demo.messages[0]["content"]
    assert [t.action for t in demo.turns][1] == f"```python\n{MBPP[0]['code'].rstrip()}\n```"
    assert demo.turns[0].observation == "1 of 1 tests passed."
    for demo in suite.demonstrations:  # the canonical episode earns the full reward
        _, components = suite.reward_fn(demo.task, demo.log)
        assert components["tests_pass"] == components["all_tests_pass"] == 1.0
    tokenizer = load_tokenizer(qwen_tokenizer_folder(tmp_path / "qwen", "qwen2.5", "instruct",
                                                     "hub"))
    traj = Trajectory.from_demonstration(
        tokenizer, demo.messages, [(t.action, t.observation, t.trainable) for t in demo.turns],
        observation_role=suite.observation_role, task=demo.task)
    assert traj.action_mask.sum() > 0 and np.all(traj.token_ids >= 0)


def test_bad_rows_stop_the_run_before_training_or_are_skipped(tmp_path, capsys):
    wrong = copy.deepcopy(HUMANEVAL[1])
    wrong["canonical_solution"] = "    return 0\n"
    untitled = {k: v for k, v in MBPP[0].items() if k != "text"}
    path = write_jsonl(tmp_path / "he.jsonl", [HUMANEVAL[0], untitled, wrong])
    config = config_of(**{"data.source": "files", "data.train_path": path})
    with pytest.raises(ValueError, match=r"1 of the rows of .*he.jsonl do not load \(.*line 2: "
                                         r"field 'text': missing\)"):
        build_suite(config, str(tmp_path / "a"))
    config.data.skip_bad_rows = True
    suite = build_suite(config, str(tmp_path / "b"))
    assert [t.task_id for t in suite.train_tasks] == ["HumanEval/0"]
    out = capsys.readouterr().out
    assert "line 2: field 'text': missing" in out
    assert ("line 3: field 'canonical_solution': the canonical solution fails 2 of its 3 "
            "tests") in out
