"""Failure warnings: each fires on the metrics of the failure it names, and only then."""
import pytest

from agentjax.config import presets
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.train.diagnostics import cached_token_frac, failure_warnings
from agentjax.train.stages.rl import episode_action_budget

HEALTHY = {"entropy": 1.0, "approx_kl": 0.01, "groups/zero_variance_frac": 0.5,
           "stop/failed": 0.0, "stop/max_turns": 0.1, "mask/leak": 0.0,
           "rollout_correction/masked_seqs": 0.1}


def _length_warnings(response_mean: float, budget: int) -> list[str]:
    warnings = failure_warnings({**HEALTHY, "length/response_mean": response_mean},
                                max_action_tokens=budget)
    return [w for w in warnings if w.startswith("length explosion")]


@pytest.mark.parametrize("variant", sorted(presets.VARIANTS))
@pytest.mark.parametrize("make_config", [presets.search_config, presets.python_config])
def test_length_explosion_fires_within_what_an_episode_can_generate(make_config, variant):
    config = make_config("grpo", variant)
    budget = episode_action_budget(config)
    generated_at_most = config.env.max_turns * config.rollout.max_new_tokens
    assert budget <= generated_at_most  # reachable: episodes can fill it
    assert _length_warnings(0.9 * budget, budget)
    assert not _length_warnings(0.5 * budget, budget)


def test_the_action_budget_is_bounded_by_the_context():
    config = presets.search_config("grpo", "test")
    config.env.max_turns, config.rollout.max_new_tokens = 100, 100
    assert episode_action_budget(config) == config.rollout.max_tokens


def test_healthy_metrics_warn_of_nothing_and_each_failure_is_named():
    assert failure_warnings(HEALTHY, max_action_tokens=100) == []
    cases = {"entropy collapse": {"entropy": 0.01},
             "KL blow-up": {"approx_kl": 2.0},
             "all groups have zero reward variance": {"groups/zero_variance_frac": 1.0},
             "length explosion": {"stop/max_turns": 0.9},
             "action-mask leak": {"mask/leak": 3.0},
             "rollout correction rejected 75% of the episodes":
                 {"rollout_correction/masked_seqs": 0.75, "logp_mismatch_kl": 0.2}}
    for name, change in cases.items():
        warnings = failure_warnings({**HEALTHY, **change}, max_action_tokens=100)
        assert len(warnings) == 1 and warnings[0].startswith(name), (name, warnings)


def test_cached_token_frac_counts_the_context_sent_each_turn():
    # Sent: 10 ids (turn 1, none cached), then 10 + 3 + 4 = 17 (12 cached); the episode
    # whose engine reports nothing is left out.
    reported = Trajectory([0] * 10, [
        Turn([1, 2, 3], [0.0] * 3, "stop", observation_ids=[4] * 4, cached_tokens=0),
        Turn([5, 6], [0.0] * 2, "stop", cached_tokens=12)])
    silent = Trajectory([0] * 5, [Turn([1], [0.0], "stop")])
    assert cached_token_frac([reported, silent]) == 12 / 27
    assert cached_token_frac([silent]) is None


def test_rerendered_turns_of_native_episodes_are_a_metric():
    from agentjax.core.trajectory import collate
    from agentjax.train.diagnostics import rollout_metrics

    def episode(**metadata):
        turns = [Turn([5, 6], [-0.1, -0.2], "stop", [7]), Turn([8], [-0.3], "stop")]
        return Trajectory([1, 2], turns, metadata=metadata)

    text = [episode(), episode()]
    native = [episode(rerendered_turns=1), episode(rerendered_turns=0)]
    for group, expected in ((text, None), (native, 1 / 4)):
        metrics = rollout_metrics([group], collate(group, buckets=[16], pad_id=0))
        assert metrics.get("tools/rerendered_turn_frac") == expected
