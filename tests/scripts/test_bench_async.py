"""scripts/bench/async.py: the arms it runs and the figures it reads from their runs."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = importlib.util.spec_from_file_location(
    "bench_async", os.path.join(ROOT, "scripts", "bench", "async.py"))
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_arms_are_sync_then_async_at_each_staleness():
    arms = bench.arms([0, 2], partial=True, latency=0.5, steps=4, warm_start="/w")
    assert [a["name"] for a in arms] == ["sync", "async_s0", "async_s2", "async_s0_partial",
                                         "async_s2_partial"]
    assert all(a["overrides"]["retrieval.latency_s"] == 0.5 and
               a["overrides"]["init_from"] == "/w" for a in arms)
    assert arms[2]["overrides"]["rollout.max_staleness"] == 2
    assert arms[4]["overrides"]["rollout.partial_rollouts"] is True


def test_in_flight_adds_wider_async_arms_and_leaves_sync_alone():
    arms = bench.arms([1], partial=False, latency=0.5, steps=4, warm_start="/w", in_flight=32)
    assert [a["name"] for a in arms] == ["sync", "async_s1", "async_s1_f32"]
    assert arms[0]["overrides"]["rollout.concurrency"] == 16
    assert arms[1]["overrides"]["rollout.engine_slots"] == 16
    assert (arms[2]["overrides"]["rollout.concurrency"],
            arms[2]["overrides"]["rollout.engine_slots"]) == (32, 32)


def _run(folder, rows, final):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps({"step": i + 1, **row}) + "\n" for i, row in enumerate(rows))
    with open(os.path.join(folder, "final.json"), "w") as f:
        json.dump(final, f)


def test_throughput_leaves_out_the_first_step_and_engine_idle_the_first_update(tmp_path):
    rows = [{"time/step_s": 50.0, "time/rollout_s": 20.0, "time/engine_idle_s": 1.0,
             "rollout/staleness_mean": 0.0, "rollout/dropped_groups": 0,
             "success/train": 0.5},
            {"time/step_s": 2.0, "time/rollout_s": 0.5, "time/engine_idle_s": 30.0,
             "rollout/staleness_mean": 1.0, "rollout/dropped_groups": 1,
             "success/train": 0.25},
            {"time/step_s": 4.0, "time/rollout_s": 1.0, "time/engine_idle_s": 1.0,
             "rollout/staleness_mean": 2.0, "rollout/dropped_groups": 0,
             "success/train": 0.75}]
    _run(tmp_path / "run", rows, {"eval/success_sampled": 0.4, "eval/success_greedy": 0.5,
                                  "time/total_s": 120.0})
    summary = bench.summarize(str(tmp_path / "run"))
    assert summary == {"steps_per_hour": 3600 * 2 / 6.0, "learner_idle": 1.5 / 6.0,
                       "engine_idle": 1.0 / 4.0, "staleness": 1.0, "dropped": 1.0,
                       "train_success": 0.5, "sampled": 0.4, "greedy": 0.5, "minutes": 2.0}
    assert bench.summarize(str(tmp_path / "missing")) is None
