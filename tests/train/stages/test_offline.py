"""End-to-end runs of the RFT and DPO configs (tiny `:test` variants): each stage trains
on the data it collected and saved (with an RFT set of one's own added), a pair file of
one's own trains the same way, and a
DPO run killed after its first collection and again after a checkpoint ends exactly as
the uninterrupted run."""
import json
import math
import os

import pytest

from agentjax.data.offline_jsonl import read_episodes, read_pairs
from agentjax.train.checkpoint import latest_committed_step
from agentjax.train.metrics import read_metrics
from tests.train import runs

pytestmark = pytest.mark.slow  # end-to-end runs

DPO = "dpo_search.py:test"
MIN_REWARD = 0.05  # rft.min_reward and dpo.min_reward of the test variants


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dpo")
    return workdir, runs.train(DPO, workdir)


def _finished(workdir, out: str, stage: str):
    """The final results and metric rows of a finished 2-step run of `stage`."""
    final = json.loads((workdir / "final.json").read_text())
    assert "eval/success_sampled" in final and f"| {stage.upper()} agent |" in out
    assert (workdir / "hf" / "model.safetensors").exists()
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows] == [1, 2]
    return final, rows


def _collection(workdir, stage: str, index: int):
    folder = workdir / stage
    return (str(folder / f"{index:04d}.jsonl"),
            json.loads((folder / f"{index:04d}.json").read_text()))


def test_rft_trains_on_the_successful_episodes_it_collected(tmp_path):
    # An episode of one's own (rft.data_path) joins every round's set.
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"token_ids": [5, 6, 7, 8], "action_mask": [0, 0, 1, 1]}))
    workdir = tmp_path / "run"
    out = runs.train("rft_search.py:test", workdir, f"--config.rft.data_path={own}")
    final, rows = _finished(workdir, out, "rft")
    assert "sft/success_greedy" in final
    # Two rounds (one step each) of 4 tasks x 4 episodes.
    assert final["rft/episodes"] == 32
    for index, row in enumerate(rows):
        path, info = _collection(workdir, "rft", index)
        kept = read_episodes(path)
        assert row["data/episodes"] == info["data/episodes"] == 16
        assert row["data/kept"] == info["data/kept"] == len(kept) > 0
        assert row["data/size"] == len(kept) + 1
        assert all(t.total_reward >= MIN_REWARD for t in kept)
        assert len({tuple(t.token_ids.tolist()) for t in kept}) == len(kept)
        assert row["nll"] > 0 and math.isfinite(row["grad_norm"])


def test_dpo_trains_on_the_pairs_it_collects_every_step(dpo_run):
    workdir, out = dpo_run
    final, rows = _finished(workdir, out, "dpo")
    episodes = 0
    for index, row in enumerate(rows):
        path, info = _collection(workdir, "dpo", index)
        pairs = read_pairs(path)  # checks every turn-level pair's shared prefix
        assert row["data/size"] == info["data/size"] == len(pairs) > 0
        levels = [p.level for p in pairs]
        assert levels.count("turn") == info["data/turn_pairs"]
        assert levels.count("trajectory") == info["data/trajectory_pairs"]
        for pair in pairs:
            assert pair.chosen.total_reward >= MIN_REWARD > pair.rejected.total_reward
            if pair.level == "turn":
                for side in (pair.chosen, pair.rejected):
                    assert not side.action_mask[:pair.shared_tokens].any()
        episodes += info["data/episodes"] + info["data/branch_episodes"]
    assert final["dpo/episodes"] == episodes == 2 * (16 + 4 * 2)
    # The first update starts at the reference: every log-ratio is 0, the loss log 2.
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[1]["loss"] != pytest.approx(math.log(2), abs=1e-6)


def test_a_pair_file_of_ones_own_trains_the_same_way(dpo_run, tmp_path):
    workdir, _ = dpo_run
    pairs, _ = _collection(workdir, "dpo", 1)
    runs.train(DPO, tmp_path, f"--config.init_from={workdir}", f"--config.dpo.data_path={pairs}",
               "--config.dpo.refresh_every=0", "--config.total_steps=1",
               "--config.eval.every=0")
    [row] = read_metrics(tmp_path)
    assert row["data/size"] == len(read_pairs(pairs)) and "data/episodes" not in row
    assert not (tmp_path / "dpo").exists()
    assert json.loads((tmp_path / "final.json").read_text())["dpo/episodes"] == 0


def test_dpo_killed_after_a_collection_and_after_a_checkpoint_ends_as_uninterrupted(
        dpo_run, tmp_path):
    reference, _ = dpo_run
    workdir = tmp_path / "run"
    runs.kill_when(DPO, workdir, when=lambda w: os.path.exists(
        os.path.join(w, "dpo", "0000.json")))
    runs.kill_when(DPO, workdir, when=lambda w: (latest_committed_step(
        os.path.join(w, "checkpoints")) or 0) >= 1)
    runs.train(DPO, workdir)
    assert runs.differences(reference, workdir) == []
    for name in ("0000.jsonl", "0001.jsonl", "0000.json", "0001.json"):
        assert (workdir / "dpo" / name).read_bytes() == (reference / "dpo" / name).read_bytes()
