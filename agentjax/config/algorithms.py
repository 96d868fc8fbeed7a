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
    # On-policy distillation (Thinking Machines, Oct 2025; rl/distillation.py): the
    # teacher's per-token signal alone, token-mean as each token is its own term, no KL
    # to the initial policy (the teacher is the anchor); algo.teacher names the teacher.
    "opd": dict(advantage="grpo", loss="ppo", agg="token-mean", kl_coef=0.0,
                distill_coef=1.0, distill_task_weight=0.0),
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


# Rollout-trainer mismatch corrections by name (rl/rollout_correction.py,
# rl/offpolicy.py): verl's RolloutCorrectionConfig presets of the decoupled mode
# (verl/trainer/config/algorithm.py, docs/algo/rollout_corr.md; agentjax's
# old_logp='recompute' is their three-policy "decoupled" mode), with verl's thresholds,
# and the forms SkyRL, IcePop and DeepSeek-V3.2 recommend. Each sets the weight
# (algo.tis_cap, tis_bound, rollout_correction.is_level) and the masks, so the name says
# everything that corrects; the thresholds it leaves are the schema's defaults.
_NO_IS = {"tis_cap": 0.0, "rollout_correction.is_level": "token"}
_TOKEN_TIS = {"tis_cap": 2.0, "tis_bound": "truncate", "rollout_correction.is_level": "token"}
_SEQ_TIS = {"tis_cap": 2.0, "tis_bound": "truncate",
            "rollout_correction.is_level": "sequence"}
# verl's Geo-RS is "seq_mean_k1" with thresholds "0.999_1.001" on mean(-log rho): the
# geometric-mean ratio kept in [1 / 1.001, 1 / 0.999].
_VERL_GEO = {"rollout_correction.masks": "geometric",
             "rollout_correction.geo_low": 1 / 1.001, "rollout_correction.geo_high": 1 / 0.999}
_VERL_K3 = {"rollout_correction.masks": "seq_mean_kl", "rollout_correction.kl_estimator": "k3",
            "rollout_correction.seq_mean_kl": 0.01}
_NO_MASKS = {"rollout_correction.masks": ""}
ROLLOUT_CORRECTION_PRESETS = {
    # verl disabled(): the mismatch metrics only.
    "disabled": {**_NO_IS, **_NO_MASKS},
    # verl decoupled_token_is() (agentjax's default): min(rho_t, 2) per token.
    "decoupled_token_is": {**_TOKEN_TIS, **_NO_MASKS},
    # verl decoupled_seq_is(): Seq-TIS, min(prod_t rho_t, 2) per sequence.
    "decoupled_seq_is": {**_SEQ_TIS, **_NO_MASKS},
    # verl decoupled_seq_is_rs(): Seq-MIS, Seq-TIS and sequences whose product ratio is
    # outside [0.5, 2] rejected ("seq_sum_k1", "0.5_2.0").
    "decoupled_seq_is_rs": {**_SEQ_TIS, "rollout_correction.masks": "product",
                            "rollout_correction.product_low": 0.5,
                            "rollout_correction.product_high": 2.0},
    # verl decoupled_geo_rs() / _token_tis() / _seq_tis(): Geo-RS alone or with TIS.
    "decoupled_geo_rs": {**_NO_IS, **_VERL_GEO},
    "decoupled_geo_rs_token_tis": {**_TOKEN_TIS, **_VERL_GEO},
    "decoupled_geo_rs_seq_tis": {**_SEQ_TIS, **_VERL_GEO},
    # verl decoupled_k3_rs() / _token_tis() / _seq_tis(): sequences whose mean k3 is above
    # 0.01 rejected, alone or with TIS.
    "decoupled_k3_rs": {**_NO_IS, **_VERL_K3},
    "decoupled_k3_rs_token_tis": {**_TOKEN_TIS, **_VERL_K3},
    "decoupled_k3_rs_seq_tis": {**_SEQ_TIS, **_VERL_K3},
    # SkyRL's recommendation (docs off_policy_correction.mdx, TLDR): the geometric mask in
    # [0.99, 1.01] and token TIS capped at 2.
    "skyrl_geo_mask_token_tis": {**_TOKEN_TIS, "rollout_correction.masks": "geometric",
                                 "rollout_correction.geo_low": 0.99,
                                 "rollout_correction.geo_high": 1.01},
    # IcePop (Ring-1T): each token weighted by rho_t inside [0.5, 5] and masked outside
    # it, M(rho) = rho 1[0.5 <= rho <= 5]: the token mask and a cap that never binds.
    "icepop": {"tis_cap": 5.0, "tis_bound": "truncate", "rollout_correction.is_level": "token",
               "rollout_correction.masks": "token", "rollout_correction.token_low": 0.5,
               "rollout_correction.token_high": 5.0},
    # DeepSeek-V3.2's off-policy sequence masking alone (delta 1e-4, slime's default).
    "opsm": {**_NO_IS, "rollout_correction.masks": "opsm",
             "rollout_correction.opsm_delta": 1e-4},
}
ROLLOUT_CORRECTIONS = tuple(ROLLOUT_CORRECTION_PRESETS)


def rollout_correction_overrides(name: str) -> dict:
    """Dotted-key overrides that set rollout correction preset `name` (old_logp
    'recompute': every preset is of verl's decoupled mode)."""
    if name not in ROLLOUT_CORRECTION_PRESETS:
        raise ValueError(f"unknown rollout correction {name!r}; choose one of "
                         f"{sorted(ROLLOUT_CORRECTION_PRESETS)}")
    return {"algo.old_logp": "recompute",
            **{f"algo.{k}": v for k, v in ROLLOUT_CORRECTION_PRESETS[name].items()}}


def apply_rollout_correction(config: ml_collections.ConfigDict,
                             name: str) -> ml_collections.ConfigDict:
    """Sets the algo keys of rollout correction preset `name`."""
    for dotted, value in rollout_correction_overrides(name).items():
        *path, key = dotted.split(".")
        node = config
        for part in path:
            node = node[part]
        node[key] = value
    return config
