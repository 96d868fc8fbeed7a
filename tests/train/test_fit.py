"""Hooks run at their interval and at the last step, in list order."""
from agentjax.train.fit import Hook, run_hooks


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
