"""scripts/bench/prefix_reuse.py's replay, on requests whose prefills are counted by
hand: what the engine prefilled, whole-context sharing, a radix tree, each emptied at a
new weight version."""
import os
import runpy
import sys

import pytest

from tests.scripts.test_train import ROOT

BENCH = os.path.join(ROOT, "scripts", "bench")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)  # the bench imports its siblings
    try:
        yield runpy.run_path(os.path.join(BENCH, "prefix_reuse.py"))
    finally:
        sys.path.remove(BENCH)


def test_replay_counts_what_each_policy_prefills(bench):
    request = bench["Request"]
    log = [
        # Two sessions' first turns on one prompt: the second shares it (3 ids cached).
        request((1, 2, 3, 4), "a", [(5, 6)], [0], False, 1),
        request((1, 2, 3, 4), "b", [(5, 6)], [3], False, 1),
        # Both take the same action and see the same observation: their second turns
        # are equal. Each session reuses its own 5 cached ids and prefills 2.
        request((1, 2, 3, 4, 5, 6, 7, 8), "a", [(9,)], [5], False, 1),
        request((1, 2, 3, 4, 5, 6, 7, 8), "b", [(9,)], [5], False, 1),
        # A new weight version: nothing is shared across it.
        request((1, 2, 3, 4), "c", [(5,)], [0], True, 2),
    ]
    rows = bench["replay"](log)
    first, later, greedy = (rows["first turn, sampled"], rows["later turn, sampled"],
                            rows["first turn, greedy"])
    assert (first["engine"], first["whole context"], first["radix"]) == (3, 3, 3)
    # Later turns: the engine prefills 2 + 2; whole-context sharing 2 + 0 (the second
    # equals the first's context); the radix tree 1 + 0 (the first turn's output 5, 6
    # was generated, so only 7 is new).
    assert (later["engine"], later["whole context"], later["radix"]) == (4, 2, 1)
    assert (greedy["engine"], greedy["whole context"], greedy["radix"]) == (3, 3, 3)
    assert [rows[k]["requests"] for k in sorted(rows)] == [1, 2, 2]
    assert later["context ids"] == 14
