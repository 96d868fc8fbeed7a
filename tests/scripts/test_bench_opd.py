"""scripts/bench/opd.py: both arms start from the teacher's SFT agent in its world, the
OPD arm names the teacher, and the report reads the curves of finished runs
(hand-written metrics.jsonl and final.json files; nothing is trained)."""
import json
import os
import runpy

from agentjax.config.algorithms import ALGORITHM_PRESETS
from tests.scripts.test_train import ROOT

bench = runpy.run_path(os.path.join(ROOT, "scripts", "bench", "opd.py"))


def _teacher(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text(json.dumps({"data": {"world_seed": 3}}))
    (teacher / "final.json").write_text(json.dumps(
        {"eval/success_sampled": 0.6, "sft/success_sampled": 0.2}))
    return str(teacher)


def _curve(run, points, minutes):
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, "metrics.jsonl"), "w") as f:
        for step, success in points:
            f.write(json.dumps({"step": step, "eval/success_sampled": success}) + "\n")
    with open(os.path.join(run.workdir, "final.json"), "w") as f:
        json.dump({"time/total_s": 60 * minutes}, f)


def test_both_arms_start_from_the_teachers_sft_agent_in_its_world(tmp_path):
    teacher = _teacher(tmp_path)
    runs = bench["planned_runs"](["grpo", "opd"], [0, 1], str(tmp_path / "out"), teacher)
    assert [(r.arm, r.seed) for r in runs] == [("grpo", 0), ("opd", 0), ("grpo", 1),
                                               ("opd", 1)]
    for run in runs:
        assert run.overrides["init_from"] == os.path.join(teacher, "sft")
        assert run.overrides["data.world_seed"] == 3 and run.overrides["seed"] == run.seed
    grpo, opd = runs[:2]
    assert "algo.teacher" not in grpo.overrides and "algo.name" not in grpo.overrides
    assert opd.overrides["algo.teacher"] == teacher
    assert opd.overrides["algo.name"] == "opd"
    for key, value in ALGORITHM_PRESETS["opd"].items():
        assert opd.overrides[f"algo.{key}"] == value


def test_steps_to_the_teachers_success():
    assert bench["steps_to"]([(10, 0.3), (20, 0.6), (30, 0.7)], 0.6) == 20
    assert bench["steps_to"]([(10, 0.3)], 0.6) is None


def test_report_gives_each_curve_and_the_steps_opd_saves(tmp_path):
    teacher = _teacher(tmp_path)
    runs = bench["planned_runs"](["grpo", "opd"], [0, 1], str(tmp_path / "out"), teacher)
    _curve(runs[0], [(10, 0.3), (20, 0.5), (30, 0.65)], 12)  # grpo, seed 0: step 30
    _curve(runs[1], [(10, 0.61), (20, 0.7)], 15)  # opd, seed 0: step 10
    _curve(runs[2], [(10, 0.2)], 11)  # grpo, seed 1: never
    text = bench["report"](teacher, runs, variant="cpu")
    assert "held-out sampled success 0.600; its SFT agent, where both arms start: 0.200" in text
    assert "| grpo | 0 | 30 | 12.0 | 10:0.30 20:0.50 30:0.65 |" in text
    assert "| opd | 0 | 10 | 15.0 | 10:0.61 20:0.70 |" in text
    assert "| grpo | 1 | - | 11.0 | 10:0.20 |" in text
    assert "| opd | 1 | - | - | - |" in text  # not run yet
    assert "| 0 | 20 |" in text and "| 1 |" not in text.split("Steps OPD saves")[1]
