"""The checks that combine keys, run by validate() once each key is in its range: what
several keys must agree on for a run to work. Each names the key to change."""
from __future__ import annotations

from agentjax.config.choices import (AGENT_ENV, KERNEL_PAGE_SIZES, OUTCOMES,
                                     PER_ROLLOUT_ADVANTAGES, TURN_LEVEL_ADVANTAGES,
                                     task_env)
from agentjax.config.errors import reject


def dotted_get(config, dotted: str):
    """config["a"]["b"] for "a.b"."""
    for name in dotted.split("."):
        config = config[name]
    return config


def check_combinations(config) -> None:
    """The checks that involve several keys (each key is already in its range)."""
    _check_reward(config)
    _check_world(config)
    if config.stage == "sft" and config.sft.steps == 0:
        reject("sft.steps", 0, "stage='sft' needs sft.steps > 0")
    _check_offline(config)
    _check_data(config)
    _check_model(config)
    _check_lora(config)
    _check_algo(config)
    _check_rollout_correction(config.algo)
    _check_distillation(config)
    _check_batches(config)
    _check_micro_tokens(config)
    _check_agent(config)
    _check_compaction(config)
    _check_sglang(config)
    if config.rollout.mode == "async":
        _check_async(config)
    _check_hosts(config)


def _check_reward(config) -> None:
    """The rewarded outcome is one the env has."""
    if config.reward.outcome not in OUTCOMES[task_env(config)]:
        tasks = ("env.agent_tasks" if config.env.name == AGENT_ENV else "env.name")
        reject("reward.outcome", config.reward.outcome,
               f"with {tasks}={task_env(config)!r} choose one of "
               f"{sorted(OUTCOMES[task_env(config)])}")
    _check_judge(config.reward)


def _check_judge(reward) -> None:
    """reward.judge is complete when the judge is the outcome, and unused otherwise."""
    judge = reward.judge
    if reward.outcome == "judge":
        if not judge.url:
            reject("reward.judge.url", "", "reward.outcome='judge' needs the judge's "
                   "OpenAI-compatible chat server, e.g. 'http://127.0.0.1:30000'")
        if not judge.model:
            reject("reward.judge.model", "", "reward.outcome='judge' needs the model name "
                   "the judge server serves")
    elif judge.url:
        reject("reward.judge.url", judge.url, "it is used only with reward.outcome='judge' "
               f"(reward.outcome is {reward.outcome!r})")
    if judge.votes > 1 and judge.temperature == 0:
        reject("reward.judge.votes", judge.votes, "several votes at "
               "reward.judge.temperature=0 repeat one greedy verdict: set a temperature > 0")


def _searches_synthetic_world(config) -> bool:
    """The tasks are a synthetic search world's (a user's agent's too: env.agent_tasks)."""
    return (task_env(config), config.data.source) == ("search", "synthetic")


def _check_world(config) -> None:
    """What only a synthetic search world has: a text corpus (pretraining), entities to
    rename, intermediate answers to relabel with."""
    synthetic = _searches_synthetic_world(config)
    for key in ("pretrain.steps", "sft.corpus_mix"):
        value = dotted_get(config, key)
        if value and not synthetic:
            reject(key, value, "> 0 needs the text corpus of a synthetic search world "
                   "(env.name='search', data.source='synthetic')")
        if value and config.pretrain.worlds < 1:
            reject(key, value, "> 0 needs pretrain.worlds >= 1 (the corpus)")
    if config.data.hindsight and not synthetic:  # an agent's: _check_agent says why
        reject("data.hindsight", True, "it relabels the questions of a synthetic search "
               "world: it needs env.name='search' and data.source='synthetic'")
    if config.sft.rename_frac and not synthetic:
        reject("sft.rename_frac", config.sft.rename_frac,
               "> 0 renames the entities of a synthetic search world: it needs "
               "env.name='search' and data.source='synthetic'")


def _check_data(config) -> None:
    """The world can be built, the files and servers the tasks need are given."""
    data = config.data
    if _searches_synthetic_world(config) and data.num_cities < data.num_countries:
        reject("data.num_cities", data.num_cities,
               f"every country needs a capital among its cities: it must be >= "
               f"data.num_countries={data.num_countries}")
    if data.source == "files" and not data.train_path:
        reject("data.train_path", "", "data.source='files' needs it")
    if (config.env.name, data.source, config.retrieval.kind) == ("search", "files", "bm25") \
            and not data.corpus_path:
        reject("data.corpus_path", "", "data.source='files' with retrieval.kind='bm25' "
               "needs the Search-R1 corpus jsonl to index")
    if config.retrieval.kind == "http" and not config.retrieval.url:
        reject("retrieval.url", "", "retrieval.kind='http' needs it")


def _check_model(config) -> None:
    """A tiny model built for the run needs a vocabulary and heads that fit its width."""
    if config.init_from or config.model.path:
        return
    if config.tokenizer.vocab_size == 0:
        reject("model.path", "", "this config loads a pretrained model "
               "(tokenizer.vocab_size=0): pass --config.model.path=/path/to/hf/folder")
    model = config.model
    if model.hidden_size % model.num_heads:
        reject("model.num_heads", model.num_heads,
               f"it must divide model.hidden_size={model.hidden_size}")
    if model.num_heads % model.num_kv_heads:
        reject("model.num_kv_heads", model.num_kv_heads,
               f"it must divide model.num_heads={model.num_heads}")


def _check_lora(config) -> None:
    """Adapters that fit every target of a tiny model built for the run (a loaded
    model's shapes are checked against model.lora once its config.json is read), and an
    adapter to import only with LoRA on."""
    lora = config.model.lora
    if lora.adapter_path and not lora.rank:
        reject("model.lora.adapter_path", lora.adapter_path, "importing a PEFT adapter "
               "trains it further: set model.lora.rank > 0 (the file's rank is used)")
    if lora.dropout:
        reject("model.lora.dropout", lora.dropout, "LoRA dropout is not implemented yet (no "
               "random stream reaches the training forward); 'LoRA Without Regret' trains "
               "without it: set 0")
    if (lora.rank and config.rollout.engine == "sglang"
            and config.rollout.sglang.lora == "adapter" and not config.init_from
            and (config.pretrain.steps or config.sft.steps)):
        reject("rollout.sglang.lora", "adapter", "the servers hold the base they were "
               "launched with, and the stage after SFT trains adapters over the SFT "
               "policy: use 'merged', or run SFT first and start this run from it "
               "(init_from)")
    if not lora.rank or config.init_from or config.model.path:
        return
    model = config.model
    head_dim = model.hidden_size // model.num_heads
    widths = {"q": (model.hidden_size, model.hidden_size),
              "k": (model.hidden_size, model.num_kv_heads * head_dim),
              "v": (model.hidden_size, model.num_kv_heads * head_dim),
              "o": (model.hidden_size, model.hidden_size),
              "gate": (model.hidden_size, model.intermediate_size),
              "up": (model.hidden_size, model.intermediate_size),
              "down": (model.intermediate_size, model.hidden_size)}
    for target in (t.strip() for t in lora.targets.split(",")):
        if lora.rank > min(widths[target]):
            reject("model.lora.rank", lora.rank, f"it exceeds min(d_in, d_out) = "
                   f"{min(widths[target])} of the {target} projection "
                   f"({list(widths[target])}) of the tiny model")


def _check_algo(config) -> None:
    """The advantage fits the algorithm and the groups; what needs groups has them."""
    algo, data = config.algo, config.data
    if (algo.advantage == "gae") != (algo.name == "ppo"):
        reject("algo.advantage", algo.advantage, f"'gae' goes with algo.name='ppo' (a "
               f"critic), and only with it; algo.name is {algo.name!r}")
    if algo.name == "ppo" and algo.critic_lr == 0:
        reject("algo.critic_lr", algo.critic_lr, "algo.name='ppo' needs a critic: > 0")
    group_based = algo.advantage in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline",
                                     *TURN_LEVEL_ADVANTAGES)
    if group_based and config.rollout.group_size < 2:
        reject("rollout.group_size", config.rollout.group_size,
               f"algo.advantage={algo.advantage!r} compares samples within a group: "
               "it must be >= 2")
    if algo.dynamic_sampling and not group_based:
        reject("algo.dynamic_sampling", True, "it filters zero-variance groups: it needs "
               "a group-based algo.advantage")
    if data.hindsight and not group_based:
        reject("data.hindsight", True, "it keeps a relabeled group when its rewards "
               "differ: it needs a group-based algo.advantage")
    if data.hindsight and algo.old_logp == "behavior":
        reject("data.hindsight", True, "relabeled episodes were sampled under another "
               "prompt, so the old log-probs must be recomputed: it needs "
               "algo.old_logp='recompute'")
    if algo.dual_clip and algo.loss != "ppo":
        reject("algo.dual_clip", algo.dual_clip, "the dual clip bounds PPO's clipped loss "
               f"(rl/policy_losses.py: PPO): it needs algo.loss='ppo', not {algo.loss!r}")
    if algo.overlong_buffer > algo.overlong_max_len:
        reject("algo.overlong_buffer", algo.overlong_buffer,
               f"it must not exceed algo.overlong_max_len={algo.overlong_max_len}")


def _check_batches(config) -> None:
    """The rollout batch splits into minibatches and micro-batches, the engine's slots
    into lanes; the episodes in flight fit the slots, the pages the attention kernel,
    an action the context."""
    algo, rollout = config.algo, config.rollout
    batch = rollout.prompts_per_step * rollout.group_size
    if batch % algo.minibatches:
        reject("algo.minibatches", algo.minibatches, f"it must divide the rollout batch "
               f"rollout.prompts_per_step x rollout.group_size = {batch}")
    minibatch = batch // algo.minibatches
    if algo.microbatch_size and minibatch % algo.microbatch_size:
        reject("algo.microbatch_size", algo.microbatch_size,
               f"it must divide the minibatch size {minibatch}")
    if rollout.engine_slots % rollout.engine_lanes:
        reject("rollout.engine_lanes", rollout.engine_lanes,
               f"rollout.engine_slots={rollout.engine_slots} must split evenly over it")
    if rollout.engine == "jax" and rollout.concurrency > rollout.engine_slots:
        reject("rollout.concurrency", rollout.concurrency,
               f"it exceeds rollout.engine_slots={rollout.engine_slots}: sessions would "
               "be evicted and re-prefilled")
    if rollout.engine_attention in KERNEL_PAGE_SIZES:
        needs, takes = KERNEL_PAGE_SIZES[rollout.engine_attention]
        if not takes(rollout.page_size):
            reject("rollout.page_size", rollout.page_size,
                   f"rollout.engine_attention={rollout.engine_attention!r} needs {needs}")
    if rollout.max_new_tokens >= rollout.max_tokens:
        reject("rollout.max_new_tokens", rollout.max_new_tokens,
               f"it must be < rollout.max_tokens={rollout.max_tokens} (the context "
               "holds the prompt too)")


def _check_micro_tokens(config) -> None:
    """Micro-batches by token budget: the RL update's alone, instead of rows, and big
    enough for the longest episode (a packed episode is never split)."""
    algo = config.algo
    if not algo.micro_tokens:
        return
    if config.stage != "rl":
        reject("algo.micro_tokens", algo.micro_tokens, f"only the RL update packs "
               f"micro-batches by tokens; stage={config.stage!r} micro-batches by rows "
               "(algo.microbatch_size): set it to 0")
    if algo.microbatch_size:
        reject("algo.micro_tokens", algo.micro_tokens, f"it replaces "
               f"algo.microbatch_size={algo.microbatch_size} (micro-batches by rows): "
               "set one of them to 0")
    if algo.micro_tokens < config.rollout.max_tokens:
        reject("algo.micro_tokens", algo.micro_tokens, f"an episode of up to "
               f"rollout.max_tokens={config.rollout.max_tokens} tokens must fit one "
               "micro-batch: it must be >= that")


def _check_hosts(config) -> None:
    """The mesh has one free axis at most; a multi-host run knows its coordinator and
    spans all devices."""
    mesh_sizes = dict(config.mesh)
    if list(mesh_sizes.values()).count(-1) > 1:
        reject("mesh", mesh_sizes, "at most one axis may be -1 (the remaining devices)")
    multihost = config.multihost
    if multihost.enabled and config.devices != -1:
        reject("devices", config.devices, "a multi-host run spans every device of its "
               "hosts: it must be -1")
    if multihost.enabled and not (multihost.coordinator and multihost.num_processes > 1):
        reject("multihost.enabled", True,
               "it needs multihost.coordinator and multihost.num_processes > 1")
    if multihost.process_id >= multihost.num_processes:
        reject("multihost.process_id", multihost.process_id,
               f"it must be < multihost.num_processes={multihost.num_processes}")


def _check_offline(config) -> None:
    """The RFT and DPO stages: one optimizer update per step, rounds that split the
    steps, micro-batches that split a step's rows, options that go together."""
    algo, stage = config.algo, config.stage
    if stage not in ("rft", "dpo"):
        return
    for key in ("ppo_epochs", "minibatches"):
        if algo[key] != 1:
            reject(f"algo.{key}", algo[key], f"stage={stage!r} makes one optimizer update "
                   "per step: it must be 1")
    section = config[stage]
    if algo.microbatch_size and section.batch_size % algo.microbatch_size:
        reject("algo.microbatch_size", algo.microbatch_size,
               f"it must divide {stage}.batch_size={section.batch_size}")
    if stage == "rft" and config.total_steps % section.rounds:
        reject("rft.rounds", section.rounds, f"it must divide total_steps="
               f"{config.total_steps} (each round trains as many steps)")
    if stage == "dpo":
        if section.label_smoothing and section.kind != "sigmoid":
            reject("dpo.label_smoothing", section.label_smoothing,
                   f"only dpo.kind='sigmoid' has one (dpo.kind is {section.kind!r})")
        if section.data_path and section.refresh_every:
            reject("dpo.refresh_every", section.refresh_every, "the pairs of dpo.data_path "
                   "are fixed: it must be 0 with a pair file")


def sglang_logprob_distribution(config) -> str:
    """What the rollout servers' log-probs are (rollout.sglang.logprob_distribution;
    'auto': the sampling distribution of launched serve.py servers, SGLang's default,
    tempered but not truncated, for servers given by URL)."""
    s = config.rollout.sglang
    if s.logprob_distribution != "auto":
        return s.logprob_distribution
    return "sampling" if s.launch else "temperature"


def _check_sglang(config) -> None:
    """rollout.sglang.* used only by the SGLang engine, which needs servers, and whose
    log-probs must be those of the sampling distribution wherever the loss uses them."""
    rollout, algo = config.rollout, config.algo
    s = rollout.sglang
    if rollout.engine != "sglang":
        for key in ("urls", "router_url", "launch"):
            if s[key]:
                reject(f"rollout.sglang.{key}", s[key],
                       "it is used only with rollout.engine='sglang'")
        return
    if bool(s.urls) == bool(s.launch):
        reject("rollout.engine", "sglang", "it needs exactly one of rollout.sglang.urls "
               "(running servers) and rollout.sglang.launch > 0 (local servers)")
    if s.router_url:
        workers = {u.strip().rstrip("/") for u in s.urls.split(",")} if s.urls else set()
        if not workers:
            reject("rollout.sglang.router_url", s.router_url, "the router's workers must be "
                   "listed in rollout.sglang.urls (weights, pause and continue go to each; "
                   "the router forwards none of them)")
        if s.router_url.rstrip("/") in workers:
            reject("rollout.sglang.router_url", s.router_url, "it is also listed in "
                   "rollout.sglang.urls, which holds the router's workers")
    if config.multihost.enabled:
        reject("rollout.engine", "sglang", "weights are not synced to servers from a "
               "multi-host run yet; use 'jax'")
    # The behavior log-probs enter the loss through the TIS weights (tis_cap), the
    # rejection masks or as the old policy (old_logp='behavior'): they must be of the
    # distribution sampled from.
    if not (algo.old_logp == "behavior" or algo.tis_cap > 0
            or algo.rollout_correction.masks):
        return
    distribution = sglang_logprob_distribution(config)
    tempered = rollout.temperature != 1.0 or rollout.final_temperature != 1.0
    truncated = rollout.top_p < 1.0 or rollout.top_k > 0
    if distribution == "raw" and tempered:
        reject("rollout.sglang.logprob_distribution", "raw", "the servers' log-probs are "
               "before temperature but rollout.temperature is not 1, and algo.old_logp="
               "'behavior' or algo.tis_cap uses them; unset SGLANG_RETURN_ORIGINAL_LOGPROB "
               "on the servers or set algo.tis_cap=0 with algo.old_logp='recompute'")
    if distribution == "temperature" and truncated:
        reject("rollout.sglang.logprob_distribution", s.logprob_distribution,
               "SGLang's log-probs are not truncated by top_p / top_k, which this run "
               "samples with, and algo.old_logp='behavior' or algo.tis_cap uses them; set "
               "rollout.top_p=1 and rollout.top_k=-1, or algo.tis_cap=0 with "
               "algo.old_logp='recompute'")


def _check_rollout_correction(algo) -> None:
    """A sequence-level weight is algo.tis_cap's, on the recomputed old policy."""
    if algo.rollout_correction.is_level == "sequence" and (
            algo.old_logp != "recompute" or not algo.tis_cap):
        reject("algo.rollout_correction.is_level", "sequence", "the sequence weight is "
               "min(prod pi_trainer / pi_engine, algo.tis_cap) on the recomputed old "
               "policy: it needs algo.tis_cap > 0 and algo.old_logp='recompute' (they are "
               f"{algo.tis_cap} and {algo.old_logp!r})")


def _check_async(config) -> None:
    """What rollout.mode='async' needs beyond each key's range."""
    rollout = config.rollout
    if config.stage != "rl":
        reject("rollout.mode", "async", f"it drives the RL stage's rollouts, and "
               f"stage={config.stage!r} has none of its own: use rollout.mode='sync'")
    if config.algo.dynamic_sampling:
        reject("algo.dynamic_sampling", True, "rollout.mode='async' does not filter "
               "groups yet: use rollout.mode='sync' for dynamic sampling")
    if rollout.final_temperature != rollout.temperature:
        reject("rollout.final_temperature", rollout.final_temperature,
               f"rollout.mode='async' trains groups sampled at other steps together: it "
               f"must equal rollout.temperature={rollout.temperature}")
    if rollout.concurrency < rollout.group_size:
        reject("rollout.concurrency", rollout.concurrency,
               f"rollout.mode='async' starts whole groups: it must be >= "
               f"rollout.group_size={rollout.group_size}")
    if rollout.queue_groups and rollout.queue_groups < rollout.prompts_per_step:
        reject("rollout.queue_groups", rollout.queue_groups,
               f"an update takes rollout.prompts_per_step={rollout.prompts_per_step} "
               "groups from the queue: it must hold at least that many")
    if config.data.hindsight:
        reject("data.hindsight", True, "rollout.mode='async' does not relabel groups yet: "
               "use rollout.mode='sync' for hindsight relabeling")
    if config.multihost.enabled:
        reject("rollout.mode", "async", "every host would train on the groups its own "
               "timing produced: multi-host runs need rollout.mode='sync'")


def _check_compaction(config) -> None:
    """Context compaction fits the context, is the env loop's (an agent manages its own
    context), and its segments train as one rollout."""
    env, algo = config.env, config.algo
    if not env.compact_at_tokens:
        return
    if env.compact_at_tokens >= config.rollout.max_tokens:
        reject("env.compact_at_tokens", env.compact_at_tokens, "it must be below "
               f"rollout.max_tokens={config.rollout.max_tokens}, with room for an "
               "observation and a summary")
    if env.name == AGENT_ENV:
        reject("env.compact_at_tokens", env.compact_at_tokens, "an agent "
               f"(env.name={AGENT_ENV!r}) manages its own context; its rewritten "
               "contexts are segments already")
    if config.data.hindsight:
        reject("data.hindsight", True, "relabeling replays an episode's turns after a new "
               "prompt; a compacted episode's earlier segments have prompts of their own")
    if config.stage in ("rft", "dpo"):
        reject("env.compact_at_tokens", env.compact_at_tokens, f"stage={config.stage!r} "
               "packs one row per episode and would leave a compacted episode's earlier "
               "segments out; compaction trains in the RL stage")
    _check_segment_advantage(config, "a compacted rollout")
    if algo.advantage in TURN_LEVEL_ADVANTAGES:
        reject("algo.advantage", algo.advantage, "its turns and anchor states are one "
               "context's; a compacted episode's segments start anew: set "
               "env.compact_at_tokens=0")


def _check_segment_advantage(config, rollout: str) -> None:
    """Several trained segments a rollout (an agent's rewritten contexts, a compacted
    episode's) count once only with an estimator that gives one advantage a sequence."""
    algo = config.algo
    if (algo.rollout_normalization and config.rollout.max_segments > 1
            and algo.advantage not in PER_ROLLOUT_ADVANTAGES):
        reject("algo.advantage", algo.advantage, "it gives each token its own value, so "
               f"it would see each segment of {rollout} alone: choose one of "
               f"{PER_ROLLOUT_ADVANTAGES} or set algo.rollout_normalization=False")


def _check_agent(config) -> None:
    """An agent run names its agent; its segments count once only with an estimator that
    gives one advantage per sequence."""
    env, algo = config.env, config.algo
    if env.name != AGENT_ENV:
        if env.agent:
            reject("env.agent", env.agent, f"it is the agent of env.name={AGENT_ENV!r}; "
                   f"env.name is {env.name!r}")
        if env.agent_transport != "in_process":
            reject("env.agent_transport", env.agent_transport, "it is how the agent of "
                   f"env.name={AGENT_ENV!r} reaches the endpoint; env.name is {env.name!r}")
        return
    module, _, function = env.agent.partition(":")
    if not (module and function):
        reject("env.agent", env.agent, "env.name='openai_agent' needs its agent as "
               "'package.module:function'")
    if config.data.hindsight:
        reject("data.hindsight", True, "relabeling replays an env's prompt; an agent's "
               "prompts are its own")
    _check_segment_advantage(config, "a rollout")
    if config.rollout.max_segments > 1 and algo.advantage in TURN_LEVEL_ADVANTAGES:
        reject("algo.advantage", algo.advantage, "its turns and anchor states are an env "
               "episode's; an agent's segments have neither: use rollout.max_segments=1")


def _check_distillation(config) -> None:
    """A teacher and its weight come together, in the RL stage."""
    algo = config.algo
    if algo.distill_coef and not algo.teacher:
        reject("algo.teacher", "", f"algo.distill_coef={algo.distill_coef} needs the "
               "teacher: an HF folder or a run's workdir with the policy's tokenizer")
    if algo.teacher and not algo.distill_coef:
        reject("algo.distill_coef", 0.0, f"algo.teacher={algo.teacher!r} is read only "
               "with a weight > 0 (algo.name='opd' sets 1)")
    if algo.distill_task_weight != 1.0 and not algo.distill_coef:
        reject("algo.distill_task_weight", algo.distill_task_weight, "it weighs the task "
               "advantage beside a teacher's signal: it needs algo.distill_coef > 0")
    if algo.distill_coef and config.stage != "rl":
        reject("algo.distill_coef", algo.distill_coef, "the teacher scores the RL "
               f"stage's samples; stage is {config.stage!r}")
