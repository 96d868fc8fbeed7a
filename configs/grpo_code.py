"""GRPO code agent: the policy writes a program, runs it against the visible tests with a
sandboxed `run` tool (bubblewrap), reads what failed, fixes it and submits; the reward is
the fraction of hidden tests its final program passes (plus format and tool shaping).

CPU default: the synthetic code world (list functions of a small language specified by
examples; envs/code/world.py), SFT on an imperfect scripted programmer (it submits a
random program without running anything in 60% of its episodes), then GRPO:

    python scripts/train.py --config configs/grpo_code.py

A real model on HumanEval / MBPP / stdin-stdout task files (JSONL or parquet; each row's
canonical solution, where it has one, becomes an SFT demonstration; bad rows are errors
naming their line and field, or skipped with --config.data.skip_bad_rows=True):

    python scripts/train.py --config configs/grpo_code.py:hf \
        --config.model.path=/data/Qwen2.5-Coder-3B-Instruct \
        --config.data.source=files --config.data.train_path=/data/mbpp_train.jsonl \
        --config.data.test_path=/data/humaneval.jsonl --workdir=/ckpt/grpo-code

A `run` call on the last allowed turn submits its program (env.submit_at_limit; False
ends such an episode with no program). Single-shot instead of run-read-fix:
--config.env.max_turns=1. All-or-nothing reward:
--config.reward.outcome=em (every hidden test passed, the success criterion). Needs bubblewrap (`apt-get install -y bubblewrap`).
Variants: cpu, hf, test (seconds; CI).
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # The model, the RL budget and the evaluation of the search agent at this machine
    # size (presets.search_agent); the task is another.
    config = presets.search_agent(variant)
    config.env.name = "code"
    # The fraction of hidden tests passed; format and tool use shaped a little.
    config.reward.outcome = "tests"
    config.reward.format_weight = 0.1
    config.reward.tool_weight = 0.05
    # Write, run, read, fix, submit: up to four actions.
    config.env.max_turns = 4
    config.pretrain.steps = 0  # no text corpus: the programs are the language
    config.sft.rename_frac = 0.0  # no entities to rename
    config.sft.negative_frac = 0.0
    config.data.rl_excludes_demo_tasks = False
    if variant == "cpu":
        # A tiny model reads examples, not instructions (the tool protocol comes from
        # the demonstrations).
        config.env.instruction = "minimal"
        # One list step or reduction (10 programs): what a 0.5M model learns to read off
        # three examples; at depth 2 (64 programs) SFT reached 1-5% against its
        # demonstrator's 37-40% (docs/results/code.md).
        config.data.code_depth = 1
        # One failure described: a report of three is 120-150 tokens of the tiny
        # tokenizer, and 512 tokens must hold three runs and the submission.
        config.env.failures_shown = 1
        config.data.train_questions, config.data.test_questions = "1:3000", "1:200"
        config.sft.num_demos = 2000
        config.sft.steps = 600
        config.sft.guess_prob, config.sft.wrong_first_prob = 0.6, 0.5
        config.rollout.max_tokens, config.rollout.max_new_tokens = 512, 48
        # Episodes of 100-450 tokens packed into micro-batches (16 rows of 512): the
        # update and the log-prob pass take ~2 s a step instead of ~12 s in rows of 512.
        config.algo.micro_tokens = 8192
        # 30 minutes on a 2-core machine: no evaluation mid-run; the SFT agent's and the
        # final evaluations stay. A step takes 12-15 s (most of it the rollout: the engine,
        # and the sandbox runs of ~250 `run` calls and ~128 rewards): 60 steps, 18-22
        # minutes a run (docs/results/code.md).
        config.eval.every = 0
        config.total_steps = 60
    elif variant == "hf":
        config.env.instruction = "short"  # the instruction and the tools' schemas
        config.data.train_questions, config.data.test_questions = "1:5000", "1:400"
        config.rollout.max_tokens, config.rollout.max_new_tokens = 8192, 1024
    else:
        config.env.instruction = "minimal"
        config.env.max_turns = 3
        config.data.train_questions, config.data.test_questions = "1:24", "1:4"
        config.sft.num_demos = 24
        config.sft.guess_prob, config.sft.wrong_first_prob = 0.5, 0.5
        config.rollout.max_tokens, config.rollout.max_new_tokens = 384, 24
    config.stage = "rl"  # after SFT
    # GRPO (as configs/grpo_search.py).
    config.algo.name = "grpo"
    config.algo.advantage = "grpo"
    config.algo.loss = "ppo"
    config.algo.clip_low, config.algo.clip_high = 0.2, 0.2
    config.algo.agg = "seq-mean-token-mean"
    return config


SWEEPS = {
    # Run-read-fix against single-shot on the same budget of steps and episodes.
    "turns": [("multi_turn", {"env.max_turns": 4}), ("single_shot", {"env.max_turns": 1})],
    "outcome": [("fraction", {"reward.outcome": "tests"}),
                ("all_or_nothing", {"reward.outcome": "em"})],
    # Turn-level credit against episode-level, each pair differing in the credit only:
    # GiGPO's anchor-state step term on top of GRPO (std-normalized as GRPO is, so its
    # weight 0 is GRPO exactly), and per-turn returns against RLOO (rl/turn_credit.py).
    "credit": [("grpo", {"algo.advantage": "grpo"}),
               ("gigpo", {"algo.advantage": "gigpo", "algo.gigpo_norm": "std"}),
               ("rloo", {"algo.advantage": "rloo"}),
               ("turn_rloo", {"algo.advantage": "turn_rloo"})],
}


def sweep(name):
    return presets.arms(SWEEPS, name)
