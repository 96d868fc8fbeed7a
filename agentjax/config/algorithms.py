"""The RL algorithms a config names (algo.name), each as the algo.* settings that define
it; every other algo.* key keeps its value. The schema's defaults are GRPO's."""
from __future__ import annotations

import ml_collections

ALGORITHM_PRESETS = {
    "grpo": dict(advantage="grpo", loss="ppo", agg="seq-mean-token-mean"),
    "dr_grpo": dict(advantage="dr_grpo", loss="ppo", agg="seq-mean-token-sum-norm"),
    "dapo": dict(advantage="grpo", loss="ppo", agg="token-mean", clip_low=0.2,
                 clip_high=0.28, dynamic_sampling=True, kl_coef=0.0, overlong_buffer=64),
    "rloo": dict(advantage="rloo", loss="ppo", agg="token-mean"),
    "reinforce_pp": dict(advantage="reinforce_pp", loss="ppo", agg="token-mean",
                         kl_in_reward=True),
    "reinforce_pp_baseline": dict(advantage="reinforce_pp_baseline", loss="ppo",
                                  agg="token-mean"),
    "gspo": dict(advantage="grpo", loss="gspo", agg="seq-mean-token-mean", clip_low=3e-4,
                 clip_high=4e-4),
    "cispo": dict(advantage="grpo", loss="cispo", agg="token-mean", clip_low=1.0,
                  clip_high=4.0),
    "ppo": dict(advantage="gae", loss="ppo", agg="token-mean", gamma=1.0, lam=0.95,
                value_clip=0.2),
}
ALGORITHMS = tuple(ALGORITHM_PRESETS)


def apply_algorithm(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Sets config.algo.name and the settings that define algorithm `name`."""
    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHM_PRESETS)}")
    config.algo.name = name
    for key, value in ALGORITHM_PRESETS[name].items():
        config.algo[key] = value
    return config


def algorithm_overrides(name: str) -> dict:
    """Dotted-key overrides that switch a config to algorithm `name` (a sweep arm's)."""
    return {"algo.name": name, **{f"algo.{k}": v for k, v in ALGORITHM_PRESETS[name].items()}}
