"""What the recipes (configs/*.py) share: the search agent at each machine size, the
offline stages' budgets, the search recipes' sweeps; and the builders the tests and
benchmarks use for any algorithm.

The variants (`configs/X.py:variant`):
  cpu   the embedded default on CPU: tiny model, offline synthetic world, pretraining
        on other worlds' documents, SFT, then RL, sized to finish in under 30 minutes
        on 2 cores.
  hf    a real local HF checkpoint (`--config.model.path=...`, required) on GPU/TPU,
        with the Search-R1 settings (instruction, lr 1e-6, group 5, KL 0.001 k3,
        temperature 1) on a synthetic world sized for its question counts, and the
        rollout-trainer mismatch corrected as SkyRL recommends (bfloat16 engine).
  test  a few seconds of everything, for CI end-to-end tests.

The long-episode forms of the RL search agent (`search_agent`, `search_config`;
configs/grpo_search.py:long), each a size above with more turns, more documents a search
and a longer context:
  long       the cpu world and model, episodes of up to 32,768 tokens (32 turns of up to
             512 tokens), micro-batches of 32,768 tokens, 8 episodes a step.
  long_test  the test world and model, episodes of up to 2,048 tokens (12 turns of up to
             128, 4 documents a search), for CI.
Both train by RL alone, from the random-init model: pretraining and SFT pack rows of
rollout.max_tokens, 32k-token rows that 2 cores cannot train in time (and a policy
trained elsewhere would need max_position_embeddings >= 32768).
"""
from __future__ import annotations

import ml_collections

from agentjax.config.algorithms import (
    algorithm_overrides,
    apply_algorithm,
    apply_rollout_correction,
    rollout_correction_overrides,
)
from agentjax.config.schema import default_config


def default_variant() -> str:
    """"cpu" on a CPU backend, "hf" elsewhere (jax is imported only to ask)."""
    import jax

    return "cpu" if jax.default_backend() == "cpu" else "hf"


def variant(arg: str | None, *, long: bool = False) -> str:
    """The variant a recipe's `get_config(arg)` builds; None: the backend's default.
    `long`: the long-episode forms (LONG_VARIANTS) are variants too.

    Raises:
      ValueError: `arg` names no variant.
    """
    name = arg or default_variant()
    names = {**VARIANTS, **LONG_VARIANTS} if long else VARIANTS
    if name not in names:
        raise ValueError(f"unknown variant {name!r}; choose one of {sorted(names)}")
    return name


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
    # SFT on the world's own facts wears that copying down into recall; half the
    # searching demonstrations with their entities renamed (facts false in this world)
    # can only be fit by reading.
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
    # KV pages for 2,048 tokens an episode on average (18 GiB at Qwen2.5-3B, half of 256 x
    # 4,096): pages follow the tokens held, and a longer episode waits for pages.
    c.rollout.kv_tokens = 256 * 2048
    c.algo.kl_coef = 0.001
    c.algo.kl_kind = "k3"
    c.algo.minibatches = 4
    c.algo.microbatch_size = 8
    # The engine samples in bfloat16 through its paged decode, the trainer recomputes in
    # bfloat16 through full-sequence attention: their log-probs differ, as vLLM's or
    # SGLang's and FSDP's do for the peers. What SkyRL recommends (docs
    # off_policy_correction.mdx, TLDR; verl's decoupled_geo_rs_token_tis with wider
    # bounds): token TIS capped at 2 and the geometric sequence mask in [0.99, 1.01].
    apply_rollout_correction(c, "skyrl_geo_mask_token_tis")
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


def _long(c, size: str):
    """Long episodes (module docstring) over the `size` variant's settings."""
    test = size == "test"
    # More turns, more documents a search, and room for all of them: an observation of
    # topk documents (about 50 tokens each) is never cut.
    c.env.max_turns = 12 if test else 32
    c.env.topk = 4 if test else 8
    c.env.max_observation_words = 400
    # Turns x (an action + an observation) fill the context: 32 x (512 + ~400) tokens.
    c.rollout.max_tokens = 2048 if test else 32768
    c.rollout.max_new_tokens = 128 if test else 512
    c.model.remat = "auto"  # every layer recomputed from 4,096 tokens on
    c.algo.micro_tokens = c.rollout.max_tokens  # one longest episode per forward-backward
    c.pretrain.steps = c.sft.steps = 0
    c.data.rl_excludes_demo_tasks = False  # no SFT: no question was demonstrated
    # A 2,048-token episode of the test form took up to ~50 s alone on 2 cores, more
    # than 120 s next to another test process.
    c.rollout.episode_timeout_s = 600.0
    if not test:
        c.rollout.prompts_per_step, c.rollout.group_size = 2, 4
        c.rollout.engine_slots = c.rollout.concurrency = 8
        # 2 cores decode these 8 episodes at 400-800 tokens/s in all: a 32k-token
        # episode would take most of an hour.
        c.rollout.episode_timeout_s = 7200.0
        c.total_steps = 10
        c.eval.every, c.eval.num_tasks, c.eval.samples = 0, 8, 1
        c.checkpoint.every = 5


# The long-episode forms: name -> the size they lengthen.
LONG_VARIANTS = {"long": "cpu", "long_test": "test"}


def _apply_variant(config: ml_collections.ConfigDict, name: str) -> str:
    """Sets a variant: its size's settings, then a long form's episodes. Returns the
    size."""
    size = LONG_VARIANTS.get(name, name)
    VARIANTS[size](config)
    if name in LONG_VARIANTS:
        _long(config, size)
    return size


def search_agent(variant_name: str) -> ml_collections.ConfigDict:
    """The search agent at a variant's machine size (or a long form), before any recipe:
    the synthetic world, the model (tiny on cpu and test, an HF checkpoint on hf),
    pretraining and the SFT warm start, the prompt and search settings, the RL budget
    (steps, batch, group size, learning rate; on hf Search-R1's KL 0.001), evaluation
    and checkpoints."""
    config = default_config()
    _apply_variant(config, variant(variant_name, long=True))
    return config


def search_config(algorithm: str, variant_name: str | None) -> ml_collections.ConfigDict:
    """The search agent trained by RL with `algorithm` (any of ALGORITHM_PRESETS, its
    settings applied before the variant's, a long form's too): configs/grpo_search.py,
    dapo_search.py and ppo_search.py for theirs."""
    config = apply_algorithm(default_config(), algorithm)
    size = _apply_variant(config, variant(variant_name, long=True))
    if algorithm == "ppo":
        config.algo.critic_warmup_steps = 0 if size == "test" else 5
    return config


def python_config(algorithm: str, variant_name: str | None) -> ml_collections.ConfigDict:
    """The python-tool agent (arithmetic in a bubblewrap sandbox) trained by RL with
    `algorithm`: configs/grpo_python.py's env for any algorithm (that recipe also sizes
    its held-out set to eval.num_tasks)."""
    name = variant(variant_name)
    config = search_config(algorithm, name)
    config.env.name = "python"
    config.pretrain.steps = 0  # no text corpus for arithmetic
    config.sft.rename_frac = 0.0  # no entities to rename
    config.env.max_turns = 3
    config.data.train_questions = "1:24" if name == "test" else "1:2000"
    config.data.test_questions = "1:4" if name == "test" else "1:200"
    config.reward.format_weight = 0.0
    # The tool schemas make the system prompt long.
    config.rollout.max_tokens = 768 if name == "test" else 1024
    return config


def offline_search(variant_name: str) -> ml_collections.ConfigDict:
    """The search agent of configs/grpo_search.py (same world, pretraining and SFT) made
    ready for an offline stage (stage "rft" or "dpo", train/stages/offline.py): one
    optimizer update per step, and both stages' budgets, the RL run's episodes."""
    name = variant(variant_name)
    c = search_config("grpo", name)
    # One optimizer update per step (the RL preset's minibatches do not apply).
    c.algo.minibatches = 1
    if name == "cpu":
        # The RL job's budget of about 5,000 episodes, the same 40 steps, from the same
        # SFT agent: RFT 4 rounds x 160 tasks x 8 episodes; DPO 4,096 episodes, plus 4
        # branches of each task with a multi-turn one.
        c.rft.rounds, c.rft.tasks = 4, 160
        c.rft.batch_size = 8  # packed rows of rollout.max_tokens, as SFT
        c.dpo.tasks = 512
        c.dpo.batch_size = 16
    elif name == "hf":
        c.total_steps = 200
        c.rft.rounds, c.rft.tasks, c.rft.batch_size = 4, 1024, 16
        c.dpo.tasks, c.dpo.batch_size = 2048, 32
    else:
        # Three SFT steps leave every episode the same failure; 40 at a larger step teach
        # the tiny model the action format often enough that rewards differ (format
        # reward 0.1 x [0, 1]), so there is something to keep and to pair, at both
        # levels (150 at the default step did too, in twice the time). Online DPO: a
        # collection every step.
        c.sft.steps, c.sft.lr = 40, 1e-2
        c.reward.format_weight = 0.1
        c.rollout.group_size = 4
        c.rft.rounds, c.rft.tasks, c.rft.min_reward = 2, 4, 0.05
        c.dpo.tasks, c.dpo.min_reward, c.dpo.branches = 4, 0.05, 2
        c.dpo.batch_size, c.dpo.refresh_every = 4, 1
    return c


def arms(sweeps: dict, name: str) -> list[dict]:
    """A recipe's `sweep(name)`: the arms of sweeps[name], {"name", "overrides"} each.

    Args:
      sweeps: sweep name -> [(arm name, {dotted key: value})].
      name: the sweep.

    Raises:
      ValueError: no such sweep.
    """
    if name not in sweeps:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(sweeps)}")
    return [{"name": arm, "overrides": overrides} for arm, overrides in sweeps[name]]


# A rollout's later segments dropped (one row each), against every segment trained with
# the rollout counted once (rl/segments.py) or each segment a sequence of its own: what
# rollout.max_segments and algo.rollout_normalization change for an agent whose prompts
# do not always extend (configs/grpo_python_agent.py, grpo_search_agent.py).
_SEGMENTS = {"rollout.max_segments": 3}
AGENT_SWEEPS = {"segments": [
    ("last_segment", {}), ("per_rollout", _SEGMENTS),
    ("per_segment", {**_SEGMENTS, "algo.rollout_normalization": False})]}


# The ablations of the RL search recipes (grpo, dapo, ppo): sweep name -> arms.
SEARCH_SWEEPS = {
    "obs_mask": [("mask_observations", {"env.loss_on_observations": False}),
                 ("no_mask", {"env.loss_on_observations": True})],
    "group_size": [(f"G{g}", {"rollout.group_size": g, "rollout.prompts_per_step": 128 // g})
                   for g in (4, 8, 16)],
    "kl": [(f"beta{b}", {"algo.kl_coef": b}) for b in (0.0, 0.001, 0.01)],
    "format_weight": [(f"format{w}", {"reward.format_weight": w}) for w in (0.0, 0.1, 0.3)],
    "algorithm": [(n, algorithm_overrides(n)) for n in ("grpo", "ppo", "dapo")],
    # The rollout-trainer mismatch corrections: none, the default token TIS, and the
    # masks of SkyRL, IcePop and DeepSeek-V3.2 (config/algorithms.py).
    "rollout_correction": [(n, rollout_correction_overrides(n)) for n in (
        "disabled", "decoupled_token_is", "skyrl_geo_mask_token_tis", "icepop", "opsm")],
}
