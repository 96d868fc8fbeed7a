"""scripts/bench/serve.py's weight sync on paper: Qwen2.5 parameter counts and sync
seconds, against values computed by hand from the models' config.json shapes."""
import argparse
import os
import runpy
import sys
import types

import pytest

from tests.scripts.test_train import ROOT

BENCH = os.path.join(ROOT, "scripts", "bench")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)  # the bench imports its siblings (timing, rollout)
    try:
        yield runpy.run_path(os.path.join(BENCH, "serve.py"))
    finally:
        sys.path.remove(BENCH)


def test_parameter_counts_match_the_models(bench):
    # 7B, by hand: embeddings + untied head 2 x 152064 x 3584; per layer q 3584^2 + 3584,
    # k and v 3584 x 512 + 512 each, o 3584^2, MLP 3 x 3584 x 18944, two norms 2 x 3584;
    # 28 layers and the final norm 3584.
    layer = (3584 ** 2 + 3584) + 2 * (3584 * 512 + 512) + 3584 ** 2 + 3 * 3584 * 18944 + 7168
    assert 28 * layer + 3584 + 2 * 152064 * 3584 == 7_615_616_512
    counts = {name: bench["parameter_count"](*shape) for name, shape in bench["QWEN25"].items()}
    assert counts == {"0.5B": 494_032_768, "3B": 3_085_938_688, "7B": 7_615_616_512}


def test_sync_seconds_take_the_slower_of_a_servers_link_and_the_shared_storage(bench):
    args = argparse.Namespace(servers=8, write_gbps=1.0, read_gbps=2.0, storage_gbps=5.0,
                              nccl_gbps=25.0)
    size, write, read, broadcast = bench["sync_seconds"](1_000_000_000, args)
    # 2 GB: written at 1 GB/s; 8 servers x 2 GB from storage at 5 GB/s (3.2 s) is slower
    # than one server's 2 GB at 2 GB/s (1 s); broadcast 2 GB at 25 GB/s.
    assert size == 2_000_000_000
    assert (write, read, broadcast) == pytest.approx((2.0, 3.2, 0.08))
    args.servers = 2  # 2 x 2 GB at 5 GB/s = 0.8 s: now a server's own link (1 s) limits
    assert bench["sync_seconds"](1_000_000_000, args)[2] == pytest.approx(1.0)


def test_a_run_without_prefill_calls_gets_its_table_row(bench):
    """Every sessionful turn's context was cached: no prefill call. The counters that
    did not move stay in the run's delta at 0 (a Counter difference dropped them, and
    the table raised KeyError: 'prefill_calls')."""
    lane = types.SimpleNamespace(stats={"prefill_calls": 0, "decode_calls": 4,
                                        "prefill_s": 0.0, "decode_s": 1.5})
    before = bench["lane_stats"]([lane])
    lane.stats.update(decode_calls=9, decode_s=2.0)
    calls = bench["counter_delta"](bench["lane_stats"]([lane]), before)
    assert calls == {"prefill_calls": 0, "decode_calls": 5, "prefill_s": 0, "decode_s": 0.5}
    episodes = {("t0", 0, 0): ((1, 2),)}
    run = bench["Rollout"](1.0, 1, 0, 2, episodes, calls=calls, cpu_s=(0.5, 0.0))
    [row] = bench["rollout_rows"]({"in-process": [run, run]}, "in-process", 1, run,
                                  work_columns=True)
    assert row[0] == "in-process" and row[-3:] == ["0 / 5", "0.00 / 0.50", "0.50 / 0.00"]
