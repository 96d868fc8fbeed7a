"""scripts/bench/rollout.py's compile budget: the programs its engines plan at the
default sizes (a run compiles exactly those for its engines: tests/engine/jax/
test_compiles.py), within what one process can hold."""
import os
import runpy
import sys

import pytest

from tests.scripts.test_train import ROOT

BENCH = os.path.join(ROOT, "scripts", "bench")
# With 2 lanes (a 2-core machine) and 4. Each program of the bench's model keeps ~370
# memory mappings in the process (measured), and Linux allows 65,530 by default: the
# 237 programs these engines planned (2 lanes) when prefill had an item count per power
# of two ended the run in its pool section (LLVM: cannot allocate memory).
BUDGET = {2: 114, 4: 105}


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)  # the bench imports its sibling timing.py
    try:
        yield runpy.run_path(os.path.join(BENCH, "rollout.py"))
    finally:
        sys.path.remove(BENCH)


@pytest.mark.parametrize("lanes", sorted(BUDGET))
def test_the_benchs_engines_stay_within_the_compile_budget(bench, lanes):
    planned = bench["planned_programs"](lanes)
    assert len(planned) == 8  # generate 4, multiturn 2, pool 2
    # A deterministic engine's programs are among those of the default engine of its
    # shapes (prefill at 4 rows, decode at every row): it adds none.
    assert planned["pool (deterministic)"] == 0
    assert sum(planned.values()) <= BUDGET[lanes]
