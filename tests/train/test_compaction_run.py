"""An RL run with context compaction on (configs/grpo_search.py:test, RL alone): its
episodes compact, every segment trains as one rollout, truncated rollouts are counted
and masked as configured, and it trains 2 steps."""
import json
import math

import pytest

from agentjax.train.metrics import read_metrics
from tests.train.runs import RL_ONLY, train


@pytest.mark.slow  # ~40 s on 2 cores: a subprocess run with its evaluation
def test_a_run_with_compaction_trains_its_segments_as_rollouts(tmp_path):
    train("grpo_search.py:test", tmp_path, *RL_ONLY, "--config.env.compact_at_tokens=200",
          "--config.rollout.max_segments=2", "--config.algo.truncated_rollouts=mask")
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["stop/failed"] == 0 and row["mask/leak"] == 0
        # The 384-token context passes 200 tokens after a search: every episode compacts
        # (its summary a turn of the first segment), and both segments train.
        assert row["rollout/compactions_mean"] >= 1 and row["rollout/segments_mean"] >= 2
        assert row["rollout/segments_dropped"] == 0
        # No cut is silent: the rollouts stopped at the context limit are counted, and
        # masked (algo.truncated_rollouts='mask'): all their rows, two per rollout.
        assert row["truncated/rollout_frac"] == row["stop/token_budget"]
        assert row["truncated/masked_rows"] == 2 * 4 * row["truncated/rollout_frac"]
        assert math.isfinite(row["loss"])
    assert "eval/success_sampled" in json.loads((tmp_path / "final.json").read_text())
