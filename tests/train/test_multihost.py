"""Multi-host: two local CPU processes (gloo) run the update of one single-process run.

Two workers (`multihost_worker.py`, 2 fake CPU devices each) form a 4-device global mesh
with the data axis across processes, each feeding only its own rows; their gathered
params and metrics must equal the unsharded single-process update.
"""
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.train import multihost_worker as worker
from tests.train.runs import with_devices

pytestmark = pytest.mark.slow  # two training processes end to end

NUM_PROCESSES = 2
TIMEOUT_S = 150  # a hung collective fails the test instead of hanging CI
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _workers(tmp_path: Path, port: int):
    """Starts the workers; whatever happens in the block, none outlives it."""
    env = with_devices(2)
    procs = []
    try:
        for pid in range(NUM_PROCESSES):
            with open(tmp_path / f"worker{pid}.log", "w") as log:
                cmd = [sys.executable, "-m", "tests.train.multihost_worker",
                       "--process-id", str(pid), "--num-processes", str(NUM_PROCESSES),
                       "--port", str(port), "--out", str(tmp_path / f"worker{pid}.npz")]
                procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait(procs, tmp_path: Path, deadline: float) -> None:
    """Waits for every worker to exit 0; fails at the first error or at the deadline."""
    def logs():
        return "\n".join(f"--- worker {pid} ---\n"
                         f"{(tmp_path / f'worker{pid}.log').read_text()[-3000:]}"
                         for pid in range(len(procs)))

    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
        assert not failed, f"a worker failed (exit {failed}):\n{logs()}"
        assert time.monotonic() < deadline, f"workers hung past {TIMEOUT_S}s:\n{logs()}"
        time.sleep(0.1)
    codes = [p.returncode for p in procs]
    assert codes == [0] * len(procs), f"worker exit codes {codes}:\n{logs()}"


def test_two_processes_match_single_process(tmp_path):
    deadline = time.monotonic() + TIMEOUT_S
    with _workers(tmp_path, _free_port()) as procs:
        # The single-process reference runs while the workers start and compile.
        graphdef, params, batch = worker.problem()
        state, metrics = worker.make_update(graphdef)(worker.initial_state(params), batch)
        expected = worker.flatten(state.params)
        moved = max(np.abs(expected[k] - v).max() for k, v in worker.flatten(params).items())
        assert moved > 1e-3  # the update changed the params measurably
        _wait(procs, tmp_path, deadline)

    for pid in range(NUM_PROCESSES):
        got = dict(np.load(tmp_path / f"worker{pid}.npz"))
        assert set(got) == set(expected) | {f"metric:{k}" for k in metrics}
        for key, value in expected.items():
            assert got[key].shape == value.shape, key
            np.testing.assert_allclose(got[key], value, atol=1e-6, rtol=0, err_msg=key)
        for name in ("loss", "grad_norm", "pg_loss", "entropy"):
            np.testing.assert_allclose(got[f"metric:{name}"], metrics[name], rtol=1e-5,
                                       err_msg=name)
