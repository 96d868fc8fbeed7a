"""The names a config chooses among, each list defined once for the code that implements
it and for `agentjax.config.validate`.

Dependency-free on purpose: `scripts/train.py` validates a config before jax or anything
heavy is imported, so a misspelled name stops a run within its first second. Each tuple
is the exact set of names its implementation accepts (named in the comment above it).
"""

# The envs (envs/registry.py: SUITES builds each one's tasks, env and reward) and their
# outcomes: env.name -> {reward.outcome: the reward component it rewards}; "em" names the
# success criterion (evaluation counts an episode solved when it reaches 1), logged
# either way; "judge" is the LLM judge of reward.judge (rewards/judge.py), in the reward
# only when chosen (it asks a server about every episode).
# The code env's: "em" every hidden test passed (all-or-nothing, the success criterion),
# "tests" the fraction passed (partial credit).
OUTCOMES = {"search": {"em": "exact_match", "f1": "f1", "judge": "judge"},
            "python": {"em": "math_match"},
            "code": {"em": "all_tests_pass", "tests": "tests_pass"}}
# The env whose episodes a user's agent plays through the OpenAI-compatible endpoint
# (envs/openai_agent): its tasks and reward are those of the env env.agent_tasks names.
AGENT_ENV = "openai_agent"
# How an agent reaches the endpoint (env.agent_transport): in the pool's own process and
# event loop (httpx's ASGI transport), or over a real local HTTP server whose URL the
# agent can hand to a subprocess or a CLI harness.
AGENT_TRANSPORTS = ("in_process", "http")


def task_env(config) -> str:
    """The env whose tasks and outcomes a run uses: env.name, or for an agent run the
    env its tasks come from (env.agent_tasks)."""
    return config.env.agent_tasks if config.env.name == AGENT_ENV else config.env.name


# models/config.py (`_ARCHS`: the HF architectures entry of each) and models/decoder.py.
ARCHS = ("llama", "qwen2", "qwen3")
# models/decoder.py: remat_policy ("auto": none for short sequences,
# full_save_attention for long ones).
REMAT_POLICIES = ("auto", "none", "full", "full_save_attention", "dots", "dots_no_batch")
# models/attention.py: segment_attention's implementations ("auto" picks by backend and
# length).
ATTENTION_IMPLS = ("auto", "dense", "blockwise", "cudnn", "splash")
# engine/jax/attention.py: resolve_attention, the JaxEngine's paged attention ("auto": the
# GPU kernel on a GPU, else the pure-JAX path).
ENGINE_ATTENTION = ("auto", "paged", "pallas_gpu", "pallas_tpu")
# models/paged_pallas.py and paged_pallas_tpu.py (check_page_size): the page sizes
# each Pallas kernel takes, as (what it needs, the test). Triton's blocks are powers of
# two; a TPU kernel's page fills whole 16-row bfloat16 tiles; both need a 16-key tile.
KERNEL_PAGE_SIZES = {
    "pallas_gpu": ("a power of two >= 16", lambda size: size >= 16 and not size & (size - 1)),
    "pallas_tpu": ("a multiple of 16", lambda size: size >= 16 and not size % 16),
}
# rl/advantages.py: ADVANTAGES ("gae" is the one with a critic: needs_critic).
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae",
              "gigpo", "turn_rloo")
# rl/turn_credit.py: the turn-level estimators' options (GiGPO's normalization, the
# per-turn return's baseline) and core/anchors.py: anchor_ids (what keys a turn's state).
GIGPO_NORMS = ("mean", "std")
TURN_BASELINES = ("episode", "turn")
TURN_ANCHORS = ("context", "observation")
# rl/segments.py: the estimators whose advantage is one value per sequence, so a
# segmented rollout gets one (algo.rollout_normalization); the others see each segment.
PER_ROLLOUT_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
# rl/turn_credit.py: the estimators that read a batch's turns and anchor states.
TURN_LEVEL_ADVANTAGES = ("gigpo", "turn_rloo")
# rl/policy_losses.py: POLICY_LOSSES.
POLICY_LOSSES = ("ppo", "gspo", "cispo", "reinforce")
# rl/aggregation.py: aggregate.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")
# rl/kl.py: kl.
KL_KINDS = ("k1", "k2", "k3", "k1+", "k3+")
# data/curriculum.py: SAMPLERS.
CURRICULA = ("uniform", "learnability", "failure_buffer")
# train/update.py: make_optimizer.
SCHEDULES = ("constant", "cosine")
# rl/prepare.py: the old policy's log-probs recomputed by the learner or the engine's.
OLD_LOGP = ("recompute", "behavior")
# rl/offpolicy.py: importance_weights (how the proximal / behavior ratio is bounded).
IS_BOUNDS = ("truncate", "mask")
# rl/offpolicy.py: importance_weights (one ratio per token, or per sequence).
IS_LEVELS = ("token", "sequence")
# rl/rollout_correction.py: MASKS (the rejection masks of the rollout-trainer mismatch)
# and the KL estimators its KL masks take.
ROLLOUT_CORRECTION_MASKS = ("token", "geometric", "product", "seq_mean_kl", "seq_max_kl",
                            "opsm")
KL_MASK_ESTIMATORS = ("k2", "k3")
# agents/sources.py: SOURCES (where the RL loop's groups come from).
ROLLOUT_MODES = ("sync", "async")
# rl/preference.py: dpo_loss.
DPO_KINDS = ("sigmoid", "ipo", "hinge")
# train/run.py: run ("sft" stops after SFT, "rl" goes on to RL, "rft" and "dpo" to the
# stages of train/stages/offline.py: STAGES).
STAGES = ("rl", "sft", "rft", "dpo")
# train/stages/offline.py: which DPO pairs a collection makes (train/stages/offline_data.py).
DPO_PAIRS = ("trajectory", "turn", "both")
# envs/search/suite.py: build_search_suite (a synthetic world, or a user's Search-R1 files).
DATA_SOURCES = ("synthetic", "files")
# envs/search/suite.py: INSTRUCTIONS (the search env's prompt).
INSTRUCTIONS = ("minimal", "short", "search_r1")
# env.tool_format: "default" is each env's own format (search: Search-R1 "tags"; python
# and code: "hermes_prompt", the schemas written into a system message by hand);
# "native": the model's chat template and tool-call parser (envs/turns.py).
TOOL_FORMATS = ("default", "tags", "hermes_prompt", "native")
# envs/search/suite.py: build_search_suite (envs/retrieval.py: BM25Retriever in-process,
# HttpRetriever for a server).
RETRIEVERS = ("bm25", "http")
# envs/search/demonstrators.py: DemonstratorConfig.guess.
GUESSES = ("sample", "mode")
# train/rollouts.py builds the rollout engine: "jax" is engine/jax/engine.py, "sglang"
# SGLangEngine over HTTP servers (sglang/client.py, built by train/engines.py from
# rollout.sglang.*).
ENGINES = ("jax", "sglang")
# models/lora.py: TARGETS (q_proj ... down_proj of every decoder layer).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# train/engines.py: how an SGLang pool gets a LoRA policy (a PEFT adapter per weight
# version, or merged full weights for servers without LoRA).
SGLANG_LORA_MODES = ("adapter", "merged")
# train/trackers/wandb_run.py: the W&B run's mode ("disabled": no W&B run).
WANDB_MODES = ("disabled", "offline", "online")
# train/fit.py: guard_nonfinite.
ON_NONFINITE = ("skip", "rollback")
# engine/protocol.py: Completion.meta["logprob_distribution"], reported_distribution (what
# an engine's log-probs are; rollout.sglang.logprob_distribution names the servers').
LOGPROB_DISTRIBUTIONS = ("sampling", "temperature", "raw")
# parsers/tool_calls.py: TOOL_PARSERS (the tool-call formats, SGLang's and vLLM's names;
# env.tool_parser also takes "auto": detect_tool_parser reads the chat template).
TOOL_PARSERS = ("qwen3_coder", "hermes", "mistral", "pythonic", "llama3_json")
# agents/loop.py: how an episode's context is compacted when it passes
# env.compact_at_tokens (the policy's own summary, or a rule that drops old observations).
COMPACTIONS = ("summary", "drop")
# train/stages/rl.py: what the loss does with a rollout cut at the context limit (kept as
# it is, or out of the loss: DAPO's overlong filtering).
TRUNCATED_ROLLOUTS = ("keep", "mask")
