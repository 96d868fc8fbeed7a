"""GRPO search agent (flagship): Search-R1-style multi-hop search with a BM25 index.

CPU default — builds the offline world, pretrains a tiny agent on the documents of
other synthetic worlds (so it can copy names from its context), warm-starts it with SFT
on an imperfect demonstrator's episodes (half of the searching ones with every entity
renamed, so that only reading fits them), trains it with GRPO and prints held-out
success of the demonstrator, the SFT agent and the GRPO agent (~22 minutes on 2 cores):

    python scripts/train.py --config configs/grpo_search.py

A real model on a GPU box / TPU pod (a local HF folder; nothing is downloaded):

    python scripts/train.py --config configs/grpo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/grpo-search

Long episodes (32 turns of 8 documents a search, up to 32,768 tokens; RL alone from the
random-init model, 8 episodes a step; presets.py: long). On 2 cores a step of 8
episodes of 5,000-8,000 tokens takes 1-2 minutes (rollouts at 430-800 tokens/s, the
update in one or two 32k-token micro-batches; docs/results/long_context.md), and the
update needs the blockwise attention (models/attention.py):

    python scripts/train.py --config configs/grpo_search.py:long

Variants: cpu (default on CPU backends), hf (default elsewhere), test (seconds; CI),
long, long_test (long episodes, seconds; CI).
Ablations: `python scripts/sweep.py --config configs/grpo_search.py --sweep NAME`
with NAME in `SWEEPS`; context compaction against episodes cut at the context limit:

    python scripts/sweep.py --config configs/grpo_search.py:long --sweep compaction \
        --seeds 0,1,2 --out runs/compaction
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg, long=True)
    # The search agent at this machine size (presets.search_agent): the world, the model,
    # pretraining and the SFT warm start, the RL budget (cpu: 40 steps of 16 questions x
    # 8 episodes at lr 5e-4 cosine; hf: Search-R1's 1000 x 64 x 5 at lr 1e-6, KL 0.001),
    # or a long form's episodes.
    config = presets.search_agent(variant)
    # The task: multi-hop questions answered by searching, rewarded by exact match.
    config.env.name = "search"
    config.reward.outcome = "em"
    config.stage = "rl"  # after pretraining and SFT
    # GRPO: an episode's advantage is its reward minus its group's mean, over the group's
    # std; PPO's clipped ratio; each sequence's token mean, averaged over sequences.
    config.algo.name = "grpo"
    config.algo.advantage = "grpo"
    config.algo.loss = "ppo"
    config.algo.clip_low, config.algo.clip_high = 0.2, 0.2
    config.algo.agg = "seq-mean-token-mean"
    return config


# Context compaction at a budget that forces it (for the long form, :long): 4,096 tokens
# hold about 8 of its 32 turns. Off, the episodes stop at the limit ('token_budget',
# counted in truncated/rollout_frac); 'summary' and 'drop' compact from 2,560 tokens on,
# leaving room for an observation, the summary request and a summary, and train every
# segment as one rollout (up to 8).
BUDGET = {"rollout.max_tokens": 4096, "algo.micro_tokens": 4096}
COMPACTED = {**BUDGET, "env.compact_at_tokens": 2560, "env.max_compactions": 7,
             "rollout.max_segments": 8}
SWEEPS = {**presets.SEARCH_SWEEPS, "compaction": [
    ("off", BUDGET),
    ("summary", {**COMPACTED, "env.compaction": "summary"}),
    ("drop", {**COMPACTED, "env.compaction": "drop", "env.compaction_keep_turns": 2})]}


def sweep(name):
    return presets.arms(SWEEPS, name)
