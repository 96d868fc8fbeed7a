"""The config schema every run starts from, and its validation.

Config files (`configs/*.py`) call `default_config()` and change values; the returned
ConfigDict is locked, so a misspelled key in a config file or a `--config.a.b=value`
override fails at once naming the key. `validate(config)` runs before anything is
built or compiled and rejects wrong types and impossible combinations with a message
that names the offending key.
"""
from __future__ import annotations

import json

import ml_collections

ALGORITHMS = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
              "gspo", "cispo", "ppo")
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
POLICY_LOSSES = ("ppo", "gspo", "cispo", "reinforce")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3", "k1+", "k3+")
CURRICULA = ("uniform", "learnability", "failure_buffer")
SCHEDULES = ("constant", "cosine")
OLD_LOGP = ("recompute", "behavior")
# env.name -> {reward.outcome: the reward component it rewards}; "em" names the success
# criterion (evaluation counts an episode solved when it reaches 1), logged either way.
OUTCOMES = {"search": {"em": "exact_match", "f1": "f1"}, "python": {"em": "math_match"}}


def default_config() -> ml_collections.ConfigDict:
    """Every key a run may set, with its default (a GRPO search agent on CPU)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_steps = 60
    c.stage = "rl"  # "rl" | "sft"
    c.init_from = ""  # a workdir (or checkpoint dir) whose latest params start this run
    c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    # Logical-axis rules as a JSON object of overrides of parallel.DEFAULT_RULES, e.g.
    # '{"embed": null, "batch": ["data", "fsdp"]}'; "" keeps the defaults.
    c.rules = ""
    c.multihost = ml_collections.ConfigDict(
        {"enabled": False, "coordinator": "", "num_processes": 1, "process_id": -1})

    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # local HF folder; "" builds a tiny random model for the world
    c.model.arch = "qwen2"
    c.model.hidden_size = 128
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.intermediate_size = 384
    c.model.dtype = "float32"
    c.model.param_dtype = "float32"
    c.model.remat = "none"
    c.model.logprob_chunk = 1024

    c.tokenizer = ml_collections.ConfigDict({"path": "", "vocab_size": 1024})
    # Extra chat-template variables, a JSON object ("" = none), e.g.
    # '{"enable_thinking": false}' for Qwen3.
    c.tokenizer.template_kwargs = ""

    c.data = ml_collections.ConfigDict()
    c.data.source = "synthetic"  # "synthetic" | "files"
    c.data.train_path = ""  # Search-R1 parquet/jsonl (source="files")
    c.data.test_path = ""
    c.data.corpus_path = ""
    c.data.world_seed = 0
    c.data.num_people = 120
    c.data.num_companies = 40
    c.data.num_cities = 40
    c.data.num_countries = 16
    c.data.train_questions = "1:400,2:400"  # hops:count (python env: total count)
    c.data.test_questions = "1:100,2:100"
    c.data.demo_hops = ""  # which training questions get demonstrations, e.g. "1,2,3:0.1"
    c.data.rl_excludes_demo_tasks = False  # RL samples only questions SFT never saw
    c.data.curriculum = "uniform"

    c.env = ml_collections.ConfigDict()
    c.env.name = "search"
    c.env.topk = 3
    c.env.max_turns = 4
    c.env.max_observation_words = 120
    c.env.instruction = "short"  # "minimal" | "short" | "search_r1" (see suites.py)
    c.env.mask_observations = True  # False: observation tokens enter the loss (ablation)

    c.retrieval = ml_collections.ConfigDict({"kind": "bm25", "url": "", "timeout_s": 10.0})

    c.reward = ml_collections.ConfigDict()
    c.reward.outcome = "em"  # rewarded outcome: "em" (exact match) or "f1" (search only)
    c.reward.format_weight = 0.0
    c.reward.tool_weight = 0.0
    c.reward.process_weight = 0.0
    c.reward.length_weight = 0.0

    # Language-model pretraining before SFT (next-token loss on every token of a text
    # corpus). A model built from scratch cannot copy a name it has never seen from its
    # context; the documents of `worlds` other synthetic worlds (same language, other
    # names and facts) teach it that without teaching any fact of the run's world.
    c.pretrain = ml_collections.ConfigDict(
        {"steps": 0, "worlds": 100, "batch_size": 8, "lr": 3e-3})

    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 0
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.num_demos = 2000
    c.sft.guess_prob = 0.5
    c.sft.guess = "sample"  # "sample" | "mode": the demonstrator's guesses (data.demonstrators)
    c.sft.repeat_prob = 0.0
    c.sft.early_stop_prob = 0.0
    c.sft.poor_query_prob = 0.0
    c.sft.negative_frac = 0.1
    # Fraction of SFT tokens drawn from the pretraining corpus (config.pretrain) rather
    # than the demonstrations: keeps what pretraining taught (copying from the context)
    # while SFT fits the demonstrations.
    c.sft.corpus_mix = 0.0
    # Fraction of the searching demonstrations (synthetic search worlds) replaced by
    # counterfactual copies with every entity renamed (data.demonstrators.EntityRenamer):
    # their facts are false in the world, so only reading the observation reproduces them.
    c.sft.rename_frac = 0.0

    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # "jax" | "sglang"
    c.rollout.sglang_urls = ""
    c.rollout.prompts_per_step = 16
    c.rollout.group_size = 8
    c.rollout.temperature = 1.0
    c.rollout.final_temperature = 1.0  # linear schedule from temperature over the run
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    c.rollout.max_new_tokens = 24
    c.rollout.max_tokens = 512
    c.rollout.concurrency = 64  # episodes in flight; <= engine_slots (no cache evictions)
    c.rollout.engine_slots = 64  # sequences decoded together by the JaxEngine
    # JaxEngine lanes (rollout.lanes.LanedEngine): engine_slots split over this many
    # engines run from their own threads; one per CPU core uses the cores XLA:CPU's
    # single decode program leaves idle.
    c.rollout.engine_lanes = 1
    c.rollout.decode_steps = 8  # tokens per device round trip of the JaxEngine
    # Batch-invariant sampling: an episode's tokens do not depend on which other episodes
    # share the engine's batches, so runs (and resumed runs) are exactly reproducible.
    c.rollout.deterministic = True
    c.rollout.episode_timeout_s = 120.0

    c.algo = ml_collections.ConfigDict()
    c.algo.name = "grpo"
    c.algo.advantage = "grpo"
    c.algo.loss = "ppo"
    c.algo.clip_low = 0.2
    c.algo.clip_high = 0.2
    c.algo.dual_clip = 0.0  # 0 disables; PPO papers use 3.0
    c.algo.agg = "token-mean"
    c.algo.agg_constant = 0.0  # seq-mean-token-sum-norm divisor; 0 = bucket length
    c.algo.kl_coef = 0.0
    c.algo.kl_kind = "k3"
    c.algo.kl_in_reward = False
    c.algo.entropy_coef = 0.0
    c.algo.gamma = 1.0
    c.algo.lam = 1.0
    c.algo.ppo_epochs = 1
    c.algo.minibatches = 1
    c.algo.microbatch_size = 0  # 0 = the whole minibatch at once
    c.algo.old_logp = "recompute"
    # old_logp="recompute": the policy-gradient term is weighted by the truncated IS ratio
    # min(pi_trainer / pi_engine, tis_cap) on action tokens (0 disables).
    c.algo.tis_cap = 2.0
    c.algo.dynamic_sampling = False
    c.algo.max_resample_rounds = 3
    c.algo.overlong_buffer = 0  # DAPO overlong shaping on action tokens; 0 disables
    c.algo.overlong_max_len = 256  # L_max of the shaping (action tokens per episode)
    c.algo.overlong_factor = 1.0
    c.algo.critic_lr = 1e-3
    c.algo.value_clip = 0.2
    c.algo.critic_warmup_steps = 0

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-3
    c.optim.schedule = "constant"
    # Schedules count optimizer updates (total_steps x ppo_epochs x minibatches per run).
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.99
    c.optim.grad_clip = 1.0

    c.eval = ml_collections.ConfigDict()
    c.eval.every = 20  # also evaluates after the last step; 0: only then
    c.eval.num_tasks = 200
    c.eval.samples = 4  # sampled attempts per task (pass@k and sampled success)

    c.checkpoint = ml_collections.ConfigDict({"every": 20, "keep": 2, "async_save": True})
    c.log = ml_collections.ConfigDict({"every": 1, "tensorboard": True, "progress": True})
    c.lock()
    return c


def _walk(reference, config, path=""):
    """Yields (path, reference_value, value) for every leaf; unknown keys raise."""
    for key in config.keys():
        where = f"{path}{key}"
        if key not in reference:
            raise ValueError(f"unknown config key {where!r}; known keys under "
                             f"{path or 'the root'}: {sorted(reference.keys())}")
        ref, val = reference[key], config[key]
        if isinstance(ref, ml_collections.ConfigDict):
            if not isinstance(val, (ml_collections.ConfigDict, dict)):
                raise ValueError(f"config key {where!r} must be a section, got {val!r}")
            yield from _walk(ref, val, where + ".")
        else:
            yield where, ref, val


def _check_type(where, ref, val):
    if isinstance(ref, bool) or isinstance(val, bool):
        ok = isinstance(ref, bool) and isinstance(val, bool)
    elif isinstance(ref, float):
        ok = isinstance(val, (int, float))
    elif isinstance(ref, (tuple, list)):
        ok = isinstance(val, (tuple, list))
    else:
        ok = isinstance(val, type(ref))
    if not ok:
        raise ValueError(f"config key {where!r} must be of type {type(ref).__name__}, "
                         f"got {type(val).__name__} {val!r}")


def _get(config, dotted: str):
    for name in dotted.split("."):
        config = config[name]
    return config


def load_saved(path: str) -> ml_collections.ConfigDict:
    """The config a run saved (`<workdir>/config.json`) over today's defaults: keys added
    since take their defaults, keys removed since are dropped (with a printed warning
    naming them)."""
    with open(path) as f:
        saved = json.load(f)
    config = default_config()

    def known(reference, values, prefix=""):
        kept, dropped = {}, []
        for key, value in values.items():
            if key not in reference:
                dropped.append(prefix + key)
            elif isinstance(value, dict) and isinstance(reference[key], ml_collections.ConfigDict):
                kept[key], more = known(reference[key], value, f"{prefix}{key}.")
                dropped += more
            else:
                kept[key] = value
        return kept, dropped

    kept, dropped = known(config, saved)
    if dropped:
        print(f"warning: {path} has keys this version no longer has, ignored: "
              f"{', '.join(dropped)}")
    config.update(kept)
    return config


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks keys, types and combinations; returns the config or raises ValueError."""
    for where, ref, val in _walk(default_config(), config):
        _check_type(where, ref, val)
    for key, choices in [("stage", ("rl", "sft")), ("algo.name", ALGORITHMS),
                         ("algo.advantage", ADVANTAGES), ("algo.loss", POLICY_LOSSES),
                         ("algo.agg", AGGREGATIONS), ("algo.kl_kind", KL_KINDS),
                         ("algo.old_logp", OLD_LOGP), ("data.curriculum", CURRICULA),
                         ("data.source", ("synthetic", "files")),
                         ("sft.guess", ("sample", "mode")),
                         ("optim.schedule", SCHEDULES), ("rollout.engine", ("jax", "sglang")),
                         ("retrieval.kind", ("bm25", "http")),
                         ("env.instruction", ("minimal", "short", "search_r1")),
                         ("model.dtype", ("float32", "bfloat16")),
                         ("model.param_dtype", ("float32", "bfloat16"))]:
        if _get(config, key) not in choices:
            raise ValueError(f"config key {key!r} is {_get(config, key)!r}; choose one of "
                             f"{list(choices)}")

    algo, rollout = config.algo, config.rollout
    def fail(msg):
        raise ValueError(f"invalid config: {msg}")

    if config.env.name not in OUTCOMES:
        fail(f"env.name {config.env.name!r} is not one of {sorted(OUTCOMES)}")
    if config.reward.outcome not in OUTCOMES[config.env.name]:
        fail(f"reward.outcome {config.reward.outcome!r} does not apply to the "
             f"{config.env.name!r} env; choose one of {sorted(OUTCOMES[config.env.name])}")

    for section in ("pretrain", "sft"):
        if config[section].steps < 0 or config[section].batch_size < 1:
            fail(f"{section}.steps must be >= 0 and {section}.batch_size >= 1")
    if config.pretrain.steps and config.pretrain.worlds < 1:
        fail("pretrain.steps > 0 needs pretrain.worlds >= 1 (the corpus)")
    if not 0.0 <= config.sft.corpus_mix < 1.0:
        fail(f"sft.corpus_mix must be in [0, 1), got {config.sft.corpus_mix}")
    if config.sft.corpus_mix and config.pretrain.worlds < 1:
        fail("sft.corpus_mix > 0 needs pretrain.worlds >= 1 (the corpus)")
    if not 0.0 <= config.sft.rename_frac <= 1.0:
        fail(f"sft.rename_frac must be in [0, 1], got {config.sft.rename_frac}")
    if config.sft.rename_frac and (config.env.name, config.data.source) != ("search", "synthetic"):
        fail("sft.rename_frac > 0 renames the entities of a synthetic search world: it needs "
             "env.name='search' and data.source='synthetic'")

    if (algo.advantage == "gae") != (algo.name == "ppo"):
        fail(f"algo.advantage='gae' goes with algo.name='ppo' (a critic); got "
             f"algo.name={algo.name!r}, algo.advantage={algo.advantage!r}")
    if algo.name == "ppo" and not algo.critic_lr > 0:
        fail("algo.name='ppo' needs a critic: algo.critic_lr > 0")
    group_based = algo.advantage in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
    if group_based and rollout.group_size < 2:
        fail(f"algo.advantage={algo.advantage!r} compares samples within a group: "
             f"rollout.group_size must be >= 2, got {rollout.group_size}")
    if algo.dynamic_sampling and not group_based:
        fail("algo.dynamic_sampling filters zero-variance groups: it needs a "
             "group-based advantage")
    if not (0 <= algo.clip_low <= 1 and algo.clip_high >= 0):
        fail(f"clip range must satisfy 0 <= algo.clip_low <= 1 and algo.clip_high >= 0; "
             f"got {algo.clip_low}, {algo.clip_high}")
    if algo.dual_clip and algo.dual_clip <= 1:
        fail(f"algo.dual_clip must be > 1 (or 0 to disable), got {algo.dual_clip}")
    if algo.kl_coef < 0 or algo.entropy_coef < 0:
        fail("algo.kl_coef and algo.entropy_coef must be >= 0")
    if not (0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1):
        fail("algo.gamma and algo.lam must lie in [0, 1]")
    batch = rollout.prompts_per_step * rollout.group_size
    if batch % algo.minibatches:
        fail(f"rollout batch {batch} (prompts_per_step x group_size) is not divisible "
             f"by algo.minibatches={algo.minibatches}")
    minibatch = batch // algo.minibatches
    if algo.microbatch_size and minibatch % algo.microbatch_size:
        fail(f"minibatch size {minibatch} is not divisible by "
             f"algo.microbatch_size={algo.microbatch_size}")
    if rollout.engine_lanes < 1 or rollout.engine_slots % rollout.engine_lanes:
        fail(f"rollout.engine_slots={rollout.engine_slots} must split evenly over "
             f"rollout.engine_lanes={rollout.engine_lanes} (>= 1)")
    if rollout.engine == "jax" and rollout.concurrency > rollout.engine_slots:
        fail(f"rollout.concurrency={rollout.concurrency} exceeds rollout.engine_slots="
             f"{rollout.engine_slots}: sessions would be evicted and re-prefilled")
    if rollout.temperature < 0 or rollout.final_temperature < 0:
        fail("rollout temperatures must be >= 0")
    if not 0 < rollout.top_p <= 1:
        fail(f"rollout.top_p must lie in (0, 1], got {rollout.top_p}")
    if rollout.engine == "sglang":
        # The config keys are reserved for the SGLang server pool; until its Engine lands a
        # run must not silently fall back to the in-process sampler.
        fail("rollout.engine='sglang' is not implemented yet; use rollout.engine='jax'")
    if config.retrieval.kind == "http" and not config.retrieval.url:
        fail("retrieval.kind='http' needs retrieval.url")
    if config.data.source == "files" and not config.data.train_path:
        fail("data.source='files' needs data.train_path")
    if config.multihost.enabled and not (config.multihost.coordinator
                                         and config.multihost.num_processes > 1):
        fail("multihost.enabled needs multihost.coordinator and num_processes > 1")
    if algo.overlong_buffer and algo.overlong_buffer > algo.overlong_max_len:
        fail("algo.overlong_buffer must not exceed algo.overlong_max_len")
    if config.rules:
        try:
            rules = json.loads(config.rules)
        except json.JSONDecodeError as error:
            fail(f"rules must be a JSON object of logical axis -> mesh axes: {error}")
        if not isinstance(rules, dict):
            fail(f"rules must be a JSON object, got {config.rules!r}")
    if config.tokenizer.template_kwargs:
        try:
            template_kwargs = json.loads(config.tokenizer.template_kwargs)
        except json.JSONDecodeError as error:
            fail(f"tokenizer.template_kwargs must be a JSON object: {error}")
        if not isinstance(template_kwargs, dict):
            fail(f"tokenizer.template_kwargs must be a JSON object, got "
                 f"{config.tokenizer.template_kwargs!r}")
    if config.optim.lr <= 0:
        fail(f"optim.lr must be > 0, got {config.optim.lr}")
    if config.stage == "sft" and config.sft.steps <= 0:
        fail("stage='sft' needs sft.steps > 0")
    return config


# What each algorithm changes from the defaults (the defaults are GRPO's).
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


def apply_algorithm(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Sets config.algo.name and the settings that define algorithm `name`."""
    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHM_PRESETS)}")
    config.algo.name = name
    for key, value in ALGORITHM_PRESETS[name].items():
        config.algo[key] = value
    return config
