"""Variants shared by the config files (configs/*.py stay a few lines each).

Variants of every search config:
  cpu   the embedded default on CPU: tiny model, offline synthetic world, pretraining
        on other worlds' documents, SFT, then RL, sized to finish in under 30 minutes
        on 2 cores.
  hf    a real local HF checkpoint (`--config.model.path=...`, required) on GPU/TPU,
        with the Search-R1 settings (instruction, lr 1e-6, group 5, KL 0.001 k3,
        temperature 1) on a synthetic world sized for its question counts.
  test  a few seconds of everything, for CI end-to-end tests.
"""
from __future__ import annotations

import jax

from agentjax.config.schema import ALGORITHM_PRESETS, apply_algorithm, default_config


def default_variant() -> str:
    return "cpu" if jax.default_backend() == "cpu" else "hf"


def _cpu(c):
    c.env.instruction = "minimal"
    # One document per search: a 0.5M-parameter reader learns to pick the relation's
    # sentence out of its subject's document; with three documents it mostly copies a
    # distractor's name within this budget.
    c.env.topk = 1
    # A world three times the default: 3570 distinct demonstrations, so SFT learns to
    # read observations rather than memorize its questions.
    c.data.num_people, c.data.num_companies = 360, 120
    c.data.num_cities, c.data.num_countries = 120, 48
    c.data.train_questions = "1:1400,2:2800"
    c.data.demo_hops = "1:0.85,2:0.85"  # SFT on 85% of the questions, RL on the rest
    c.data.rl_excludes_demo_tasks = True
    c.total_steps = 40
    # Without pretraining, SFT teaches recall of the facts its demonstrations state and
    # the agent rarely reads a never-demonstrated fact out of an observation; 1200 steps
    # on 100 other worlds' documents (4M tokens, ~1.8 epochs) teach it to copy from its
    # context first (fewer steps make copying fragile).
    c.pretrain.steps = 1200
    c.sft.steps = 1000
    c.sft.batch_size = 8  # packed rows of rollout.max_tokens
    c.sft.lr = 3e-3
    # SFT on the world's own facts wears that copying down into recall; half the searching demonstrations with their entities
    # renamed (facts false in this world) can only be fit by reading.
    c.sft.rename_frac = 0.5
    c.optim.lr = 5e-4
    # A constant 5e-4 peaks mid-run and slides back as entropy rises; decaying it keeps
    # the gains.
    c.optim.schedule = "cosine"
    c.algo.minibatches = 2
    # The demonstrator answers without searching in 60% of its episodes, with the most
    # frequent training answer of the question's relation (and searches perfectly
    # otherwise): SFT imitates the guessing, RL has to unlearn it.
    c.sft.guess_prob, c.sft.guess, c.sft.early_stop_prob = 0.6, "mode", 0.0
    c.eval.every = 20
    c.checkpoint.every = 10


def _hf(c):
    c.model.path = ""  # required: --config.model.path=/path/to/hf/checkpoint
    c.model.dtype = "bfloat16"  # compute; master weights and Adam state stay float32
    c.model.remat = "full"
    c.model.logprob_chunk = 512
    c.tokenizer.vocab_size = 0
    c.env.instruction = "search_r1"
    c.env.max_observation_words = 400
    c.env.max_turns = 4
    # The synthetic search world, four times the default: a world of n people (with n/3
    # companies and cities, n/7.5 countries) has 4.27 n one-hop questions and about twice
    # as many of each further hop, so 1600 one-hop questions need n >= 375. 5000 training
    # questions are about 13 epochs of the run's 64k prompts; building the world and
    # measuring its scripted baselines takes well under a minute. A Search-R1 dataset
    # instead: data.source='files' with data.train_path, data.test_path, data.corpus_path.
    c.data.num_people, c.data.num_companies = 480, 160
    c.data.num_cities, c.data.num_countries = 160, 64
    c.data.train_questions = "1:1500,2:1500,3:1000,4:1000"
    c.data.test_questions = "1:100,2:100,3:100,4:100"
    c.sft.steps = 0
    c.total_steps = 1000
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.rollout.prompts_per_step = 64
    c.rollout.group_size = 5
    c.rollout.max_tokens = 4096
    c.rollout.max_new_tokens = 500
    c.rollout.engine_slots = 256
    c.rollout.concurrency = 256
    c.algo.kl_coef = 0.001
    c.algo.kl_kind = "k3"
    c.algo.minibatches = 4
    c.algo.microbatch_size = 8
    c.eval.every = 50
    c.eval.num_tasks = 400
    c.checkpoint.every = 50


def _test(c):
    c.data.num_people, c.data.num_companies = 16, 8
    c.data.num_cities, c.data.num_countries = 8, 4
    c.data.train_questions = "1:24,2:24"
    c.data.test_questions = "1:4,2:4"
    c.model.hidden_size, c.model.intermediate_size = 32, 64
    c.model.num_layers, c.model.num_heads, c.model.num_kv_heads = 1, 2, 1
    c.tokenizer.vocab_size = 400
    c.pretrain.steps, c.pretrain.worlds = 2, 2
    c.sft.steps, c.sft.batch_size = 3, 8
    c.total_steps = 2
    c.rollout.prompts_per_step, c.rollout.group_size = 2, 2
    c.rollout.max_tokens, c.rollout.max_new_tokens = 384, 12
    c.rollout.engine_slots = c.rollout.concurrency = 8
    c.eval.every, c.eval.num_tasks, c.eval.samples = 2, 4, 2
    c.checkpoint.every = 1
    c.log.tensorboard = False
    c.log.progress = False


VARIANTS = {"cpu": _cpu, "hf": _hf, "test": _test}


def search_config(algorithm: str, variant: str | None):
    """The search-agent config for `algorithm` (see config.ALGORITHM_PRESETS)."""
    variant = variant or default_variant()
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {sorted(VARIANTS)}")
    config = apply_algorithm(default_config(), algorithm)
    VARIANTS[variant](config)
    if algorithm == "ppo":
        config.algo.critic_warmup_steps = 0 if variant == "test" else 5
    return config


def python_config(algorithm: str, variant: str | None):
    """The python-tool (arithmetic in a bubblewrap sandbox) config for `algorithm`."""
    config = search_config(algorithm, variant)
    config.env.name = "python"
    config.pretrain.steps = 0  # no text corpus for arithmetic
    config.sft.rename_frac = 0.0  # no entities to rename
    config.env.max_turns = 3
    config.data.train_questions = "1:24" if variant == "test" else "1:2000"
    config.data.test_questions = "1:4" if variant == "test" else "1:200"
    config.reward.format_weight = 0.0
    # The tool schemas make the system prompt long.
    config.rollout.max_tokens = 768 if variant == "test" else 1024
    return config


def _offline_cpu(c, stage):
    # The RL job's budget of about 5,000 episodes, the same 40 steps, from the same SFT
    # agent; one optimizer update per step (the RL preset's two minibatches do not apply).
    c.algo.minibatches = 1
    c.rft.rounds, c.rft.tasks = 4, 160  # 4 x 160 tasks x 8 episodes
    c.rft.batch_size = 8  # packed rows of rollout.max_tokens, as SFT
    c.dpo.tasks = 512  # 4,096 episodes, plus 4 branches of each task with a multi-turn one
    c.dpo.batch_size = 16
    # DPO moves a policy faster than GRPO's clipped ratio does (the loss is unbounded in
    # the log-ratio), so its step is smaller; neither value was tuned.
    c.optim.lr = 5e-4 if stage == "rft" else 1e-4


def _offline_hf(c, stage):
    c.algo.minibatches = 1
    c.total_steps = 200
    c.rft.rounds, c.rft.tasks, c.rft.batch_size = 4, 1024, 16
    c.dpo.tasks, c.dpo.batch_size = 2048, 32
    c.optim.lr = 1e-6 if stage == "rft" else 5e-7  # DPO's usual step on a pretrained model


def _offline_test(c, stage):
    # Three SFT steps leave every episode the same failure; 150 teach the tiny model the
    # action format often enough that rewards differ (format reward 0.1 x [0, 1]), so
    # there is something to keep and to pair. Online DPO: a collection every step.
    c.sft.steps = 150
    c.reward.format_weight = 0.1
    c.rollout.group_size = 4
    c.rft.rounds, c.rft.tasks, c.rft.min_reward = 2, 4, 0.05
    c.dpo.tasks, c.dpo.min_reward, c.dpo.branches = 4, 0.05, 2
    c.dpo.batch_size, c.dpo.refresh_every = 4, 1


OFFLINE_VARIANTS = {"cpu": _offline_cpu, "hf": _offline_hf, "test": _offline_test}


def offline_config(stage: str, variant: str | None):
    """The search agent's config for stage "rft" or "dpo" (train/stages/offline.py) after the
    SFT of the RL configs (same world, pretraining and demonstrations)."""
    variant = variant or default_variant()
    config = search_config("grpo", variant)
    config.stage = stage
    OFFLINE_VARIANTS[variant](config, stage)
    return config


# Ablation arms of the RFT and DPO configs: stage -> sweep name -> [(arm, overrides)].
OFFLINE_SWEEPS = {
    "rft": {
        # The same episode budget in one, two or four rounds.
        "rounds": [(f"rounds{n}", {"rft.rounds": n, "rft.tasks": 640 // n})
                   for n in (1, 2, 4)],
        "accumulate": [("latest", {"rft.accumulate": False}),
                       ("all", {"rft.accumulate": True})],
    },
    "dpo": {
        "beta": [(f"beta{b}", {"dpo.beta": b}) for b in (0.05, 0.1, 0.3)],
        # The same episode budget: one collection of 512 tasks, or four of 128.
        "online": [("offline", {"dpo.refresh_every": 0, "dpo.tasks": 512}),
                   ("online", {"dpo.refresh_every": 10, "dpo.tasks": 128})],
        "pairs": [(kind, {"dpo.pairs": kind}) for kind in ("trajectory", "turn", "both")],
        "kind": [(kind, {"dpo.kind": kind}) for kind in ("sigmoid", "ipo", "hinge")],
    },
}


def offline_sweep(stage: str, name: str) -> list[dict]:
    """Ablation arms of the RFT and DPO configs: {"name", "overrides"} each."""
    arms = OFFLINE_SWEEPS[stage]
    if name not in arms:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(arms)}")
    return [{"name": arm, "overrides": overrides} for arm, overrides in arms[name]]


def algorithm_overrides(name: str) -> dict:
    """Dotted-key overrides that switch a config to algorithm `name`."""
    return {"algo.name": name, **{f"algo.{k}": v for k, v in ALGORITHM_PRESETS[name].items()}}


def search_sweep(name: str) -> list[dict]:
    """Ablation arms of the search configs: {"name", "overrides"} each."""
    arms = {
        "obs_mask": [("mask_observations", {"env.mask_observations": True}),
                     ("no_mask", {"env.mask_observations": False})],
        "group_size": [(f"G{g}", {"rollout.group_size": g, "rollout.prompts_per_step":
                                  128 // g}) for g in (4, 8, 16)],
        "kl": [(f"beta{b}", {"algo.kl_coef": b}) for b in (0.0, 0.001, 0.01)],
        "format_weight": [(f"format{w}", {"reward.format_weight": w}) for w in (0.0, 0.1, 0.3)],
        "algorithm": [(n, algorithm_overrides(n)) for n in ("grpo", "ppo", "dapo")],
    }
    if name not in arms:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(arms)}")
    return [{"name": arm, "overrides": overrides} for arm, overrides in arms[name]]
