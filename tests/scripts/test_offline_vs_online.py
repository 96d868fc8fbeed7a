"""scripts/bench/offline_vs_online.py: every method starts from its seed's SFT export (or
one run's), and the report reads finished runs (hand-written final.json files; nothing is
trained)."""
import json
import os
import runpy

from tests.scripts.test_train import ROOT

bench = runpy.run_path(os.path.join(ROOT, "scripts", "bench", "offline_vs_online.py"))


def _finish(run, final, config=None):
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, "final.json"), "w") as f:
        json.dump(final, f)
    if config is not None:
        with open(os.path.join(run.workdir, "config.json"), "w") as f:
            json.dump(config, f)


def test_methods_start_from_their_seeds_sft_export(tmp_path):
    sft, runs = bench["planned_runs"](["rft", "dpo_online"], [0, 1], str(tmp_path))
    assert [(r.arm, r.seed) for r in sft] == [("sft", 0), ("sft", 1)]
    assert [(r.arm, r.seed) for r in runs] == [("rft", 0), ("dpo_online", 0), ("rft", 1),
                                               ("dpo_online", 1)]  # whole seeds first
    for run in runs:
        assert run.overrides["init_from"] == str(tmp_path / "sft" / f"seed{run.seed}" / "sft")
        assert run.overrides["seed"] == run.overrides["data.world_seed"] == run.seed
    assert runs[1].overrides["dpo.refresh_every"] == 10 and "dpo.refresh_every" not in \
        runs[0].overrides
    _, [offline] = bench["planned_runs"](["dpo_offline"], [0], str(tmp_path))
    assert offline.overrides["dpo.refresh_every"] == 0


def test_one_sft_agent_for_every_seed_in_its_world(tmp_path):
    """--sft_from: every seed's methods start from one finished run's SFT export, with
    that run's world seed, and the report's SFT rows read that run's final.json."""
    main_job = tmp_path / "main_job"
    main_job.mkdir()
    (main_job / "final.json").write_text(json.dumps(
        {"sft/success_sampled": 0.33, "sft/success_greedy": 0.03}))
    (main_job / "config.json").write_text(json.dumps({"data": {"world_seed": 1}}))
    sft, runs = bench["planned_runs"](["rft"], [0, 2], str(tmp_path / "out"), str(main_job))
    assert [r.workdir for r in sft] == [str(main_job)] * 2
    for run in runs:
        assert run.overrides["init_from"] == str(main_job / "sft")
        assert run.overrides["data.world_seed"] == 1 and run.overrides["seed"] == run.seed
    text = bench["report"](sft, runs, variant="cpu")
    assert "| 0 | SFT (start) | 0.330 | 0.030 | - | - |" in text
    assert "| 2 | SFT (start) | 0.330 | 0.030 | - | - |" in text


def test_report_tables_success_episodes_minutes_and_the_offline_verdict(tmp_path):
    sft, runs = bench["planned_runs"](["grpo", "rft"], [0, 1], str(tmp_path))
    for run, sampled in zip(sft, (0.30, 0.40)):
        _finish(run, {"sft/success_sampled": sampled, "sft/success_greedy": 0.1})
    grpo_config = {"algo": {"dynamic_sampling": False}, "total_steps": 40,
                   "rollout": {"prompts_per_step": 16, "group_size": 8}}
    _finish(runs[0], {"eval/success_sampled": 0.8, "eval/success_greedy": 0.9,
                      "time/total_s": 600.0}, grpo_config)
    _finish(runs[1], {"eval/success_sampled": 0.35, "eval/success_greedy": 0.2,
                      "time/total_s": 300.0, "rft/episodes": 5120})
    _finish(runs[3], {"eval/success_sampled": 0.38, "eval/success_greedy": 0.3,
                      "time/total_s": 420.0, "rft/episodes": 5120})
    text = bench["report"](sft, runs, variant="cpu")
    assert "| 0 | SFT (start) | 0.300 | 0.100 | - | - |" in text
    assert "| 0 | grpo | 0.800 | 0.900 | 5120 | 10.0 |" in text
    assert "| 1 | grpo | - | - | - | - |" in text  # not finished
    assert "| 1 | rft | 0.380 | 0.300 | 5120 | 7.0 |" in text
    assert "| rft | 2 | 0.365 | 0.250 | 5120 | 6.0 |" in text  # means
    # Seed 1's RFT agent (0.38) is below its SFT start (0.40).
    assert "| rft | 1 of 2 seeds | no |" in text
