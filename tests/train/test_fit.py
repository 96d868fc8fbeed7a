"""Hooks run at their interval and at the last step, in list order; the loop's
checkpointer is closed however the loop ends."""
import jax.numpy as jnp
import ml_collections
import pytest

from agentjax.train.checkpoint import Checkpointer, latest_committed_step
from agentjax.train.fit import Hook, Stage, fit, run_hooks
from agentjax.train.runtime import Runtime


def test_hooks_run_every_n_steps_and_at_the_last_in_order():
    calls = []
    hooks = [Hook(3, lambda step, state, metrics: calls.append(("eval", step))),
             Hook(1, lambda step, state, metrics: calls.append(("log", step))),
             Hook(0, lambda step, state, metrics: calls.append(("end", step)))]
    for step in range(1, 8):
        run_hooks(hooks, step, 7, state=None, metrics={})
    assert [s for name, s in calls if name == "eval"] == [3, 6, 7]
    assert [s for name, s in calls if name == "log"] == list(range(1, 8))
    assert [s for name, s in calls if name == "end"] == [7]
    assert calls[-3:] == [("eval", 7), ("log", 7), ("end", 7)]


def test_a_later_hook_sees_what_an_earlier_one_added():
    seen = []
    hooks = [Hook(2, lambda step, state, metrics: metrics.update(eval=step)),
             Hook(1, lambda step, state, metrics: seen.append(dict(metrics)))]
    for step in (1, 2):
        run_hooks(hooks, step, 5, state=None, metrics={})
    assert seen == [{}, {"eval": 2}]


@pytest.mark.parametrize("stop", [None, RuntimeError("rollout broke"), KeyboardInterrupt(),
                                  SystemExit(143)])
def test_the_checkpointer_is_closed_however_the_loop_ends(stop, tmp_path, monkeypatch):
    """Normal end, an error, Ctrl-C, SIGTERM (scripts/train.py raises SystemExit): the
    asynchronous save of step 1 is committed and orbax's manager closed."""
    closed = []
    close = Checkpointer.close
    monkeypatch.setattr(Checkpointer, "close", lambda self: (closed.append(self.directory),
                                                             close(self)))
    runtime = Runtime(workdir=str(tmp_path), mesh=None, rules={}, is_main=True,
                      checkpoint=ml_collections.ConfigDict(
                          {"every": 1, "keep": 2, "async_save": True}),
                      progress=False)

    class Stopping(Stage):
        name = desc = "test"
        folder, steps, log_every = str(tmp_path), 2, 1

        def host_state(self, done):
            return {"step": done}

        def draw(self, state, step):
            if step == 1 and stop is not None:
                raise stop

        def train(self, state, data, step):
            return state, {"loss": 1.0}

        def postfix(self, row):
            return {}

    loop = Stopping()
    if stop is None:
        fit(runtime, loop, {"w": jnp.zeros(2)}, checkpoint_every=1)
    else:
        with pytest.raises(type(stop)):
            fit(runtime, loop, {"w": jnp.zeros(2)}, checkpoint_every=1)
    assert closed == [str(tmp_path / "checkpoints")]
    assert latest_committed_step(str(tmp_path / "checkpoints")) == (1 if stop else 2)
