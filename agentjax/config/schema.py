"""Every config key, once: its default, the rule its values obey, and what it means.

The schema is a list of sections (`run` is the top level), each a list of `Key`s.
`default_config()` and `RULES` are derived from it: a key cannot have a default without
a rule, nor be defined twice. Config files (`configs/*.py`) start from
`default_config()` and change values; the ConfigDict it returns is locked, so a
misspelled key in a config file or a `--config.a.b=value` override fails at once.
`validate()` (config/validation.py) checks each value against its key's rule, then the
combinations of keys (config/checks.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from agentjax.config.algorithms import ALGORITHMS
from agentjax.config.mcp_servers import MCP_SERVERS
from agentjax.config.choices import (
    ADVANTAGES,
    AGENT_ENV,
    AGENT_TRANSPORTS,
    AGGREGATIONS,
    ARCHS,
    ATTENTION_IMPLS,
    COMPACTIONS,
    CURRICULA,
    DATA_SOURCES,
    DPO_KINDS,
    DPO_PAIRS,
    ENGINE_ATTENTION,
    ENGINES,
    LORA_TARGETS,
    GIGPO_NORMS,
    GUESSES,
    INSTRUCTIONS,
    IS_BOUNDS,
    IS_LEVELS,
    KL_MASK_ESTIMATORS,
    KL_KINDS,
    LOGPROB_DISTRIBUTIONS,
    OLD_LOGP,
    ON_NONFINITE,
    OUTCOMES,
    POLICY_LOSSES,
    REMAT_POLICIES,
    RETRIEVERS,
    ROLLOUT_MODES,
    SCHEDULES,
    SGLANG_LORA_MODES,
    STAGES,
    TOOL_FORMATS,
    TRUNCATED_ROLLOUTS,
    TURN_ANCHORS,
    TURN_BASELINES,
    WANDB_MODES,
)
from agentjax.config.rules import (
    ANY_REAL,
    CHUNK_WIDTHS,
    CORRECTION_MASK_LIST,
    COUNT,
    FIXED,
    FREE,
    FOLDER_TO_CREATE,
    HOP_COUNTS,
    HOP_FRACTIONS,
    HOST_PORT,
    JSON_OBJECT,
    LORA_TARGET_LIST,
    NAME,
    NAME_OR_DEFAULT,
    NON_NEGATIVE,
    ONE_LINE,
    POSITIVE,
    POSITIVE_REAL,
    PROBABILITY,
    SERVED_MODEL,
    TAGS,
    TEMPLATE_KWARGS,
    TITLE,
    TRACKING_URI,
    URL,
    URLS,
    Choice,
    Flag,
    Grows,
    Integer,
    OnResume,
    Path,
    Real,
    Rule,
)


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of its section: `name` (dotted within the section), its default, what its
    values may be, what it means, and whether a resumed run may change it (`resume`:
    config/rules.py's FIXED, the default, FREE or Grows; config/resume.py)."""

    name: str
    default: Any
    rule: Rule
    doc: str
    resume: OnResume = FIXED


class Section:
    """A top-level section of the config (name "" for the keys at the root): what it is
    for, and its keys."""

    def __init__(self, name: str, doc: str, *keys: Key):
        self.name, self.doc, self.keys = name, doc, keys


# The byte alphabet (256), the chat control tokens and the agent tags of a tokenizer
# built for a tiny model (models.tokenizer.build_tokenizer) need this many ids.
MIN_TINY_VOCAB = 269
DTYPES = ("float32", "bfloat16")
OFF = ((0, "off"),)
ONLY_AFTER_THE_LAST_STEP = ((0, "only after the last step"),)
MESH_AXIS = Integer(1, special=((-1, "the remaining devices"),))


def _planned_over_total_steps(config) -> str | None:
    """What the run plans over total_steps, so that more steps would change the steps
    it has taken (None: nothing)."""
    if config.stage == "sft":
        return None
    if config.stage in ("rft", "dpo"):
        return f"stage={config.stage!r} plans its rounds over total_steps"
    if config.optim.schedule != "constant":
        return f"optim.schedule={config.optim.schedule!r} decays the lr over total_steps"
    if config.rollout.final_temperature != config.rollout.temperature:
        return "the rollout temperature moves to rollout.final_temperature over total_steps"
    return None


RUN = Section(
    "", "The run: its seed, length and stage, what it starts from, the devices and hosts.",
    Key("seed", 0, COUNT, "seeds the run's initialization, sampling and task order"),
    Key("total_steps", 60, POSITIVE, "steps of the stage that follows SFT (an RL step is "
        "one rollout batch: algo.ppo_epochs x algo.minibatches updates)",
        resume=Grows(_planned_over_total_steps)),
    Key("stage", "rl", Choice(STAGES), "what follows SFT: 'rl', 'sft' (nothing: the run "
        "stops after SFT), 'rft' or 'dpo' (train/stages/offline.py)"),
    Key("init_from", "", Path("folder", "a run's workdir, checkpoint folder or HF folder"),
        "a workdir (or checkpoint dir) whose latest params start this run"),
    Key("devices", -1, Integer(1, special=((-1, "all of them"),)), "how many of the "
        "devices the mesh spans: the first N (one process only: a test, or a share of "
        "the machine); -1 all of them"),
    Key("mesh.data", -1, MESH_AXIS, "devices of the data-parallel axis"),
    Key("mesh.fsdp", 1, MESH_AXIS, "devices the parameters and optimizer state are sharded "
        "over (FSDP)"),
    Key("mesh.tensor", 1, MESH_AXIS, "devices of the tensor-parallel axis"),
    Key("rules", "", JSON_OBJECT, "logical-axis rules: a JSON object of overrides of "
        "parallel.DEFAULT_RULES, e.g. '{\"embed\": null, \"batch\": [\"data\", \"fsdp\"]}'; "
        "'' keeps the defaults"),
    Key("multihost.enabled", False, Flag(), "one run over several hosts (jax.distributed)"),
    Key("multihost.coordinator", "", HOST_PORT, "host:port of process 0, which the others "
        "connect to", resume=FREE),
    Key("multihost.num_processes", 1, POSITIVE, "how many processes (hosts) the run spans"),
    Key("multihost.process_id", -1,
        Integer(0, special=((-1, "from the cluster environment"),)),
        "this process's index; -1: from the cluster environment"),
)

MODEL = Section(
    "model", "The policy: a local HF checkpoint, or a tiny random model built for the run.",
    Key("path", "", Path("folder", "a local HF checkpoint"),
        "a local HF folder; '' builds a tiny random model for the world (the shape below)"),
    Key("arch", "qwen2", Choice(ARCHS), "the tiny model's architecture"),
    Key("hidden_size", 128, POSITIVE, "the tiny model's width"),
    Key("num_layers", 2, POSITIVE, "the tiny model's decoder layers"),
    Key("num_heads", 4, POSITIVE, "the tiny model's attention heads"),
    Key("num_kv_heads", 2, POSITIVE, "the tiny model's key/value heads (grouped-query "
        "attention)"),
    Key("intermediate_size", 384, POSITIVE, "the tiny model's MLP width"),
    Key("dtype", "float32", Choice(DTYPES), "compute dtype of the policy, critic and "
        "reference forwards, of the rollout engine's weights and KV cache, and of HF "
        "exports. Params and optimizer state are float32 master weights whatever it is "
        "(no param-dtype key: a bfloat16 weight ignores any update under 2^-9 of itself, "
        "so lr 1e-6 would train nothing)"),
    Key("remat", "auto", Choice(REMAT_POLICIES), "what the backward pass recomputes "
        "rather than stores (models/decoder.py: remat_policy); 'auto': nothing below "
        "4,096 tokens, 'full_save_attention' (every layer recomputed from its input, the "
        "blockwise attention's output and logsumexp kept) from there"),
    Key("attention", "auto", Choice(ATTENTION_IMPLS), "the full-sequence attention "
        "(models/attention.py): 'auto' is cuDNN flash on GPU, splash on TPU, blockwise "
        "elsewhere, and the dense T x T product up to 512 tokens"),
    Key("attention_block", 256, POSITIVE, "query / key block length of the blockwise "
        "attention (sequences are padded to a multiple inside)"),
    Key("logprob_chunk", 1024, POSITIVE, "tokens whose logits are computed at once for "
        "log-probs and losses (the whole [T, vocab] logits never materialize)"),
    Key("logprob_positions", 1.0, Real("(0, 1]"), "share of a row's positions the "
        "losses' lm-head runs at: < 1 gathers the loss-mask positions first and computes "
        "logits there only (rl/logprobs.py: masked_token_logprobs; a row with more runs "
        "every position, so the values never change); 1: every position"),
    Key("lora.rank", 0, Integer(0, special=OFF), "LoRA (models/lora.py): every stage "
        "trains rank-r adapters W + (alpha/r) A B over a frozen base stored in model.dtype "
        "(adapters and their Adam moments float32), and its KL reference is the base with "
        "the adapters off; at most min(d_in, d_out) of each target. 0: full fine-tuning"),
    Key("lora.alpha", 32.0, POSITIVE_REAL, "the adapters' update is scaled by "
        "alpha / rank (PEFT's lora_alpha; 32 as in 'LoRA Without Regret')"),
    Key("lora.targets", ",".join(LORA_TARGETS), LORA_TARGET_LIST, "the adapted "
        "projections of every layer; attention-only adapters learn less than ones that "
        "include the MLP at equal parameter count (a warning says so)"),
    Key("lora.dropout", 0.0, Real("[0, 1)"), "probability of dropping each input of A "
        "in the training forward (PEFT's lora_dropout); only 0 is implemented (a check "
        "refuses others), and it is what PEFT exports record"),
    Key("lora.adapter_path", "", Path("folder", "a PEFT LoRA adapter"), "a PEFT adapter "
        "folder (adapter_config.json + adapter_model.safetensors) to continue training: "
        "its rank, alpha and targets replace model.lora's, its base must be the model's"),
)

TOKENIZER = Section(
    "tokenizer", "The tokenizer: the loaded model's, or one built for the tiny model.",
    Key("path", "", Path("folder", "a tokenizer"), "a tokenizer folder (nothing reads it "
        "yet: the tokenizer is the loaded model's, or built from the world's texts)"),
    Key("vocab_size", 1024, Integer(MIN_TINY_VOCAB, special=((0, "the loaded model's"),)),
        "ids of the tokenizer built for a tiny model; 0: a pretrained model's own"),
    Key("template_kwargs", "", TEMPLATE_KWARGS, "extra chat-template variables, a JSON "
        "object ('' = none), e.g. '{\"enable_thinking\": false}' for Qwen3"),
)

DATA = Section(
    "data", "The tasks: a synthetic world (its size and questions) or a user's Search-R1 "
    "files, the demonstrations SFT gets, and how RL samples the questions.",
    Key("source", "synthetic", Choice(DATA_SOURCES), "'synthetic' (a generated world) or "
        "'files' (Search-R1 parquet/jsonl, below)"),
    Key("train_path", "", Path("file", "Search-R1 parquet or jsonl"),
        "training questions (data.source='files')"),
    Key("test_path", "", Path("file", "Search-R1 parquet or jsonl"),
        "held-out questions (data.source='files')"),
    Key("corpus_path", "", Path("file", "Search-R1 corpus jsonl"),
        "the documents the search tool indexes (data.source='files')"),
    Key("file_prompt", True, Flag(), "a Search-R1 parquet's `prompt` column is what the "
        "agent sees (env.instruction then applies only to tasks without one); False "
        "rebuilds every prompt from the question with env.instruction (e.g. 'minimal' for "
        "a tiny model trained from scratch)"),
    Key("skip_bad_rows", False, Flag(), "rows of data.train_path/test_path that do not "
        "load (no answer, a repeated id, ...) are skipped with a warning instead of an "
        "error naming them"),
    Key("world_seed", 0, COUNT, "seeds the synthetic world: its entities, facts and "
        "questions"),
    Key("code_depth", 2, Integer(1, 2), "synthetic code world: steps a program composes "
        "(1: one list step or reduction, 10 programs; 2: also one of them applied to a "
        "list step, 64 programs; envs/code/world.py)"),
    # A world needs two entities of each type (envs.search.world.WorldConfig).
    Key("num_people", 120, Integer(2), "people of the synthetic world"),
    Key("num_companies", 40, Integer(2), "companies of the synthetic world"),
    Key("num_cities", 40, Integer(2), "cities of the synthetic world (every country's "
        "capital among them)"),
    Key("num_countries", 16, Integer(2), "countries of the synthetic world"),
    Key("train_questions", "1:400,2:400", HOP_COUNTS, "training questions, hops:count "
        "(python env: the total count)"),
    Key("test_questions", "1:100,2:100", HOP_COUNTS, "held-out questions, hops:count"),
    Key("demo_hops", "", HOP_FRACTIONS, "which training questions get demonstrations, "
        "hops:fraction, e.g. '1:0.85,2:0.85' ('' every one)"),
    Key("rl_excludes_demo_tasks", False, Flag(), "RL samples only questions SFT never saw"),
    Key("curriculum", "uniform", Choice(CURRICULA), "how RL picks a step's training "
        "questions (data/curriculum.py: SAMPLERS)"),
    Key("hindsight", False, Flag(), "hindsight relabeling (synthetic search worlds): an "
        "RL group that solved nothing, where some episode answered an intermediate "
        "entity of the question, trains as a group for the shorter question it answered "
        "(agents/hindsight.py)"),
)

ENV = Section(
    "env", "The environment the agent acts in (envs/registry.py: SUITES).",
    Key("name", "search", Choice((*OUTCOMES, AGENT_ENV)), "'search' (multi-hop "
        "questions, a search tool), 'python' (arithmetic, a sandboxed Python tool), 'code' "
        "(programs written, run against tests and fixed; envs/code) or 'openai_agent' "
        "(your own agent, env.agent, through the OpenAI-compatible endpoint; "
        "docs/agents.md)"),
    Key("topk", 3, POSITIVE, "documents a search returns"),
    Key("max_turns", 4, POSITIVE, "actions an episode may take"),
    Key("max_observation_words", 120, POSITIVE, "an observation's documents are cut after "
        "this many words"),
    Key("failures_shown", 3, POSITIVE, "code env: failed tests a `run` observation "
        "describes (the rest are counted)"),
    Key("submit_at_limit", True, Flag(), "code env: a `run` call on the last allowed turn "
        "submits its program (as SWE-agent's autosubmission); False ends that episode "
        "with no program"),
    Key("instruction", "short", Choice(INSTRUCTIONS), "the search prompt: 'minimal', "
        "'short' or 'search_r1' (envs/registry.py: INSTRUCTIONS)"),
    Key("tool_format", "default", Choice(TOOL_FORMATS), "how the agent calls tools: "
        "'default' (search: Search-R1 'tags'; python, code: 'hermes_prompt', the schemas "
        "written into a system message) or 'native' (the schemas through the model's chat "
        "template, calls read by env.tool_parser, results as the template's tool "
        "messages; envs/turns.py)"),
    Key("tool_parser", "auto", ONE_LINE, "native tool calls: the parser "
        "(parsers/tool_calls.py: hermes, qwen3_coder, llama3_json, mistral, pythonic, ...) "
        "or 'auto' (named after the tokenizer's chat template)"),
    Key("loss_on_observations", False, Flag(), "True puts the observation tokens (what "
        "the tools returned) into the loss, an ablation; False trains only the agent's "
        "own tokens"),
    Key("agent", "", ONE_LINE, "env.name='openai_agent': the agent, "
        "'package.module:function' naming an `async def agent(client, task)` that returns "
        "its reward or {'answer': ...} for env.agent_tasks' reward (docs/agents.md)"),
    Key("agent_tasks", "python", Choice(tuple(OUTCOMES)), "env.name='openai_agent': the "
        "env whose tasks the agent gets and whose reward function scores its answer"),
    Key("agent_transport", "in_process", Choice(AGENT_TRANSPORTS), "env.name="
        "'openai_agent': how the agent's client reaches the endpoint: 'in_process' (on the "
        "pool's event loop, no sockets) or 'http' (a local server; str(client.base_url) is "
        "a real URL a subprocess or CLI agent can be given)"),
    Key("mcp_servers", "", MCP_SERVERS, "MCP servers whose tools the env offers besides its "
        "own, a JSON list ('' = none), e.g. '[{\"name\": \"time\", \"command\": "
        "\"mcp-server-time\"}]' (config/mcp_servers.py: the fields; envs/mcp.py)"),
    Key("compact_at_tokens", 0, Integer(1, special=OFF), "context compaction "
        "(agents/loop.py): when an observation takes an episode's context past this many "
        "tokens, the episode goes on in a new segment of the same rollout whose prompt is "
        "the system prompt, the task and a compacted history (env.compaction); below "
        "rollout.max_tokens, with room for an observation and a summary (0: off)"),
    Key("compaction", "summary", Choice(COMPACTIONS), "'summary': the policy is asked to "
        "summarize its progress, and its summary (trained, in the old segment) replaces "
        "the history; 'drop': the observations of all but the last "
        "env.compaction_keep_turns turns are replaced by a placeholder"),
    Key("compaction_keep_turns", 2, POSITIVE, "env.compaction='drop': the last this many "
        "turns keep their observations"),
    Key("max_compactions", 4, POSITIVE, "compactions an episode may make; then the "
        "context limit applies (stop reason 'token_budget'). Segments past "
        "rollout.max_segments are not trained (rollout/segments_dropped)"),
)

RETRIEVAL = Section(
    "retrieval", "The search tool's retriever (envs/retrieval.py).",
    Key("kind", "bm25", Choice(RETRIEVERS), "'bm25' (an index in-process) or 'http' (a "
        "retrieval server at retrieval.url)"),
    Key("url", "", URL, "the retrieval server (retrieval.kind='http')", resume=FREE),
    Key("timeout_s", 10.0, POSITIVE_REAL, "seconds a search request may take"),
    Key("latency_s", 0.0, NON_NEGATIVE, "every search waits this long before answering, as "
        "a remote retrieval server would (50-500 ms): benchmarks against slow tools"),
)

REWARD = Section(
    "reward", "An episode's reward: its outcome plus weighted shaping terms "
    "(envs/registry.py: reward_config). reward.judge: with outcome 'judge', an "
    "OpenAI-compatible chat server (SGLang, vLLM) grades each episode against the task's "
    "reference answers (rewards/judge.py).",
    Key("outcome", "em", Choice(tuple(dict.fromkeys(o for by_env in OUTCOMES.values()
                                                    for o in by_env))),
        "the rewarded outcome: 'em' (exact match), or for search 'f1' or 'judge' (an LLM "
        "judge); held-out success is exact match whichever is rewarded. Code: 'tests' "
        "(the fraction of hidden tests passed) or 'em' (1 when all pass: success)"),
    Key("format_weight", 0.0, NON_NEGATIVE, "weight of the well-formed-actions reward"),
    Key("tool_weight", 0.0, NON_NEGATIVE, "weight of the tool-use shaping (valid calls "
        "rewarded, duplicate and invalid ones penalized)"),
    Key("process_weight", 0.0, NON_NEGATIVE, "weight of the subgoal reward of multi-hop "
        "tasks (the intermediate entities reached)"),
    Key("length_weight", 0.0, NON_NEGATIVE, "a linear penalty on turns beyond two; DAPO's "
        "overlong shaping on the sampled tokens is algo.overlong_buffer"),
    Key("judge.url", "", URL, "the judge's chat server, e.g. 'http://127.0.0.1:30000'",
        resume=FREE),
    Key("judge.model", "", SERVED_MODEL, "the model name the judge server serves"),
    Key("judge.votes", 1, POSITIVE, "judge replies per episode, the majority decides; a "
        "judge that gives no verdict fails the episode"),
    Key("judge.temperature", 0.0, NON_NEGATIVE, "the judge's sampling temperature"),
    Key("judge.max_tokens", 256, POSITIVE, "tokens a judge reply may have"),
    Key("judge.timeout_s", 60.0, POSITIVE_REAL, "seconds a judge request may take"),
)

PRETRAIN = Section(
    "pretrain", "Language-model pretraining before SFT: next-token loss on every token of "
    "a text corpus. A model built from scratch cannot copy a name it has never seen from "
    "its context; the documents of other synthetic worlds (same language, other names "
    "and facts) teach it that without teaching any fact of the run's world.",
    Key("steps", 0, COUNT, "pretraining steps (0: none)"),
    Key("worlds", 100, COUNT, "other synthetic worlds whose documents are the corpus"),
    Key("batch_size", 8, POSITIVE, "rows a step"),
    Key("lr", 3e-3, POSITIVE_REAL, "learning rate"),
)

SFT = Section(
    "sft", "Supervised fine-tuning on a scripted demonstrator's episodes, the loss on the "
    "agent's tokens only (the warm start). The demonstrator searches perfectly unless the "
    "probabilities below make it err (envs/search/demonstrators.py).",
    Key("steps", 0, COUNT, "SFT steps (0: none)"),
    Key("batch_size", 32, POSITIVE, "packed rows of rollout.max_tokens a step"),
    Key("lr", 3e-3, POSITIVE_REAL, "learning rate"),
    Key("num_demos", 2000, POSITIVE, "demonstrations generated"),
    Key("guess_prob", 0.5, PROBABILITY, "per episode: the demonstrator answers at once "
        "with a guess instead of searching"),
    Key("guess", "sample", Choice(GUESSES), "how it guesses: 'sample' a training answer "
        "of the question's relation, or 'mode', the most frequent one"),
    Key("repeat_prob", 0.0, PROBABILITY, "per hop read (but the last): it issues the same "
        "query once more (a wasted turn)"),
    Key("early_stop_prob", 0.0, PROBABILITY, "per episode of >= 2 hops: it answers the "
        "bridge entity one hop early"),
    Key("poor_query_prob", 0.0, PROBABILITY, "per search: it queries a fragment of the "
        "name and reads sloppily"),
    Key("wrong_first_prob", 0.0, PROBABILITY, "code world, per solving episode: the "
        "demonstrator first runs a wrong program, reads the failure, then runs the right "
        "one (envs/code/world.py)"),
    Key("partial_tool_prob", 0.0, PROBABILITY, "python world, per tool-using episode of "
        ">= 3 operands: the demonstrator runs the tool on the expression without its "
        "last operand and answers with that sub-result (envs/python/suite.py)"),
    Key("negative_frac", 0.1, PROBABILITY, "per episode: one malformed action, then the "
        "env's correction and the right action (Agent-FLAN negatives; the malformed turn "
        "is not trained, the recovery is)"),
    Key("corpus_mix", 0.0, Real("[0, 1)"), "fraction of SFT tokens drawn from the "
        "pretraining corpus rather than the demonstrations: keeps what pretraining taught "
        "(copying from the context) while SFT fits the demonstrations"),
    Key("rename_frac", 0.0, PROBABILITY, "fraction of the searching demonstrations "
        "(synthetic search worlds) replaced by copies with every entity renamed "
        "(envs.search.demonstrators.EntityRenamer): their facts are false in the world, so only "
        "reading the observation reproduces them"),
)

ROLLOUT = Section(
    "rollout", "Sampling the episodes RL trains on: the engine, the batch, the sampling "
    "and the context, and where each step's groups come from (agents/sources.py). "
    "rollout.sglang: the SGLang engine's HTTP servers (train/engines.py). rollout.mode "
    "'async': a producer thread keeps `concurrency` episodes in flight while the learner "
    "updates.",
    Key("engine", "jax", Choice(ENGINES), "'jax' (in-process) or 'sglang' (HTTP servers)"),
    Key("sglang.urls", "", URLS, "comma-separated server URLs (SGLang, a router, "
        "scripts/serve.py)", resume=FREE),
    Key("sglang.router_url", "", URL, "an sglang-router in front of rollout.sglang.urls "
        "(its workers): every /generate goes to it, weight syncs, pause / continue and "
        "the startup check to the workers (docs/sglang.md)", resume=FREE),
    Key("sglang.launch", 0, COUNT, "or: start this many local scripts/serve.py servers",
        resume=FREE),
    Key("sglang.weights_dir", "", FOLDER_TO_CREATE, "where exported weight versions go "
        "for the servers to load ('': <workdir>/weights); remote servers need it on "
        "shared storage at the same path"),
    Key("sglang.logprob_distribution", "auto", Choice(("auto",) + LOGPROB_DISTRIBUTIONS),
        "what the servers' log-probs are: 'sampling' (after temperature and truncation, "
        "as serve.py), 'temperature' (SGLang's default: tempered, not truncated), 'raw' "
        "(SGLANG_RETURN_ORIGINAL_LOGPROB=1); 'auto': sampling if launched, else "
        "temperature"),
    Key("sglang.server_sessions", False, Flag(), "servers given by URL that are "
        "scripts/serve.py keep each episode's KV cache between turns when told its "
        "session (launched servers always are); SGLang's radix cache needs no session, "
        "so leave it off there"),
    Key("sglang.lora", "adapter", Choice(SGLANG_LORA_MODES), "with model.lora.rank > 0: "
        "'adapter' writes a PEFT folder per weight version that servers load with "
        "/load_lora_adapter and every /generate names (servers run with --enable-lora); "
        "'merged' exports full merged weights for servers without LoRA"),
    Key("sglang.max_in_flight", 128, POSITIVE, "requests in flight per server",
        resume=FREE),
    Key("sglang.grace_s", 120.0, POSITIVE_REAL, "all servers down this long: the run saves "
        "and stops", resume=FREE),
    Key("sglang.startup_timeout_s", 600.0, POSITIVE_REAL, "seconds launched servers may "
        "take to start", resume=FREE),
    Key("prompts_per_step", 16, POSITIVE, "questions (groups) an RL step rolls out"),
    Key("group_size", 8, POSITIVE, "episodes per question"),
    Key("max_segments", 1, POSITIVE, "batch rows per rollout: a rollout whose model "
        "calls do not extend one another's tokens (an agent that rewrote its history) is "
        "several segments, each a row; one of more keeps its last this many (the others "
        "are counted in rollout/segments_dropped). The batch has prompts_per_step x "
        "group_size x this many rows"),
    Key("temperature", 1.0, NON_NEGATIVE, "the sampling temperature"),
    Key("final_temperature", 1.0, NON_NEGATIVE, "the temperature at the run's end, on a "
        "linear schedule from rollout.temperature"),
    Key("top_p", 1.0, Real("(0, 1]"), "nucleus sampling's probability mass (1: all)"),
    Key("top_k", -1, Integer(1, special=((-1, "no top-k cut"),)),
        "sample among the k likeliest tokens; -1: no cut"),
    Key("max_new_tokens", 24, POSITIVE, "tokens an action (one turn) may have"),
    Key("max_tokens", 512, Integer(2), "tokens an episode's context holds: the prompt, "
        "the actions and the observations"),
    Key("concurrency", 64, POSITIVE, "episodes in flight; <= engine_slots (no cache "
        "evictions)"),
    Key("engine_slots", 64, POSITIVE, "sequences decoded together by the JaxEngine"),
    Key("engine_lanes", 1, POSITIVE, "JaxEngine lanes (rollout.lanes.LanedEngine): "
        "engine_slots split over this many engines run from their own threads; one per "
        "CPU core uses the cores XLA:CPU's single decode program leaves idle"),
    Key("decode_steps", 8, POSITIVE, "tokens per device round trip of the JaxEngine"),
    Key("prefill_chunks", "16,64,256", CHUNK_WIDTHS, "the JaxEngine's prefill chunk widths: "
        "a sequence's tokens are prefilled in chunks of these, one program each (small "
        "chunks suit a CPU; a GPU fills with wider ones, e.g. '256,1024,4096')"),
    Key("deterministic_prefill_rows", 4, POSITIVE, "rows of every JaxEngine prefill call "
        "when rollout.deterministic (each row is a sequence; more rows fill a large "
        "device, fewer waste less on padding)"),
    Key("engine_overlap", True, Flag(), "the JaxEngine dispatches each decode call before "
        "reading the one before (SGLang's overlap scheduler); outputs are the same either "
        "way when rollout.deterministic"),
    Key("page_size", 64, POSITIVE, "slots per page of the JaxEngine's paged KV cache"),
    Key("engine_attention", "auto", Choice(ENGINE_ATTENTION), "the JaxEngine's attention: "
        "'paged' (pure JAX, a loop over each row's pages), 'pallas_gpu' (a Pallas GPU "
        "paged-attention kernel; page_size a power of two >= 16), 'pallas_tpu' (a Pallas "
        "TPU one, DMAs from the pool in HBM; page_size a multiple of 16) or 'auto' "
        "(pallas_gpu on a GPU, else paged)"),
    Key("kv_tokens", 0, Integer(1, special=((0, "engine_slots x max_tokens: no request "
                                                 "ever waits for pages"),)),
        "KV slots of the JaxEngine's page pool (over all lanes): pages are taken as "
        "episodes grow and freed when they end, so a pool sized to the tokens the "
        "episodes really hold is enough; when it runs out, requests wait"),
    Key("deterministic", True, Flag(), "batch-invariant sampling: an episode's tokens do "
        "not depend on which other episodes share the engine's batches, so runs (and "
        "resumed runs) are exactly reproducible"),
    Key("episode_timeout_s", 120.0, POSITIVE_REAL, "wall-clock seconds an episode may "
        "take; one that runs longer is returned flagged"),
    Key("mode", "sync", Choice(ROLLOUT_MODES), "'sync': rolled out under the current "
        "weights, then trained on; 'async': rolled out while the learner updates"),
    Key("max_staleness", 1, COUNT, "async: a group is trained at most this many weight "
        "versions after the oldest weights that sampled it (0 gives exactly the sync run)"),
    Key("queue_groups", 0, Integer(1, special=(
        (0, "(rollout.max_staleness + 1) x rollout.prompts_per_step"),)),
        "async: at most this many groups finished or in flight"),
    Key("partial_rollouts", False, Flag(), "async: episodes in flight continue under new "
        "weights (their tokens carry mixed versions) instead of new weights waiting until "
        "they finish"),
)

ALGO = Section(
    "algo", "The RL update: the advantage, the policy loss and how it aggregates, the KL "
    "and entropy terms, the epochs and batches of an update, the old policy, DAPO's "
    "dynamic sampling and overlong shaping, PPO's critic. The defaults are GRPO's; "
    "config/algorithms.py has what each algo.name sets.",
    Key("name", "grpo", Choice(ALGORITHMS), "the algorithm (config/algorithms.py)"),
    Key("advantage", "grpo", Choice(ADVANTAGES), "the advantage estimator "
        "(rl/advantages.py: ADVANTAGES): critic-free, or 'gae' with PPO's critic"),
    Key("loss", "ppo", Choice(POLICY_LOSSES), "the policy loss (rl/losses.py: policy_loss)"),
    Key("clip_low", 0.2, PROBABILITY, "the ratio's lower clip is 1 - clip_low"),
    Key("clip_high", 0.2, NON_NEGATIVE, "the ratio's upper clip is 1 + clip_high"),
    Key("dual_clip", 0.0, Real("(1, inf)", special=OFF), "dual-clip bound on the loss of "
        "negative advantages (0: off; PPO papers use 3.0)"),
    Key("agg", "token-mean", Choice(AGGREGATIONS), "how token losses make the batch's "
        "(rl/losses.py: aggregate)"),
    Key("agg_constant", 0.0, Real("(0, inf)", special=((0, "the bucket length"),)),
        "seq-mean-token-sum-norm's divisor; 0: the bucket length"),
    Key("kl_coef", 0.0, NON_NEGATIVE, "weight of the KL to the reference policy"),
    Key("kl_kind", "k3", Choice(KL_KINDS), "the KL estimator (rl/kl.py)"),
    Key("kl_in_reward", False, Flag(), "the KL penalizes the reward (REINFORCE++) instead "
        "of entering the loss"),
    Key("entropy_coef", 0.0, NON_NEGATIVE, "weight of the entropy bonus"),
    Key("gamma", 1.0, PROBABILITY, "GAE's discount"),
    Key("lam", 1.0, PROBABILITY, "GAE's lambda"),
    Key("ppo_epochs", 1, POSITIVE, "passes over a step's rollout batch"),
    Key("minibatches", 1, POSITIVE, "optimizer updates per pass: the batch's split"),
    Key("microbatch_size", 0, Integer(1, special=((0, "the whole minibatch"),)),
        "sequences per forward-backward, gradients accumulated; 0: the whole minibatch "
        "at once"),
    Key("micro_tokens", 0, Integer(1, special=((0, "micro-batches by rows"),)),
        "tokens per forward-backward: a minibatch's episodes are packed into micro-batches "
        "of this many tokens (replaces algo.microbatch_size); 0: micro-batches by rows"),
    Key("old_logp", "recompute", Choice(OLD_LOGP), "the old policy's log-probs: "
        "recomputed by the trainer, or the engine's ('behavior')"),
    Key("tis_cap", 2.0, Real("(0, inf)", special=OFF), "old_logp='recompute': the "
        "policy-gradient term is weighted by the truncated IS ratio min(pi_trainer / "
        "pi_engine, tis_cap) on action tokens (0: off)"),
    Key("tis_bound", "truncate", Choice(IS_BOUNDS), "how that weight is bounded: "
        "'truncate' min(ratio, tis_cap), 'mask' 0 above tis_cap (AReaL's "
        "behav_imp_weight_cap); rl/offpolicy.py"),
    Key("dynamic_sampling", False, Flag(), "groups whose rewards are all equal are set "
        "aside and the batch is refilled by further rollouts (DAPO)"),
    Key("max_resample_rounds", 3, COUNT, "further rollout rounds a step may take to refill"),
    Key("overlong_buffer", 0, Integer(1, special=OFF), "DAPO's soft overlong punishment "
        "on the exact sampled (action) tokens of an episode, added to its reward "
        "(agents/groups.py: Overlong): the penalty ramps over this many tokens "
        "before overlong_max_len (0: off)"),
    Key("overlong_max_len", 256, POSITIVE, "L_max of the shaping (action tokens per "
        "episode)"),
    Key("overlong_factor", 1.0, NON_NEGATIVE, "the shaping's penalty at L_max"),
    Key("truncated_rollouts", "keep", Choice(TRUNCATED_ROLLOUTS), "a rollout cut short "
        "(stopped at the context limit, 'token_budget', or a row cut at the largest "
        "collate bucket; truncated/rollout_frac counts them): 'keep' trains it as it is, "
        "'mask' takes all its tokens out of the loss, its reward still in its group's "
        "statistics (DAPO's overlong filtering); overlong shaping is "
        "algo.overlong_buffer"),
    Key("rollout_normalization", True, Flag(), "a rollout of several segments (batch "
        "rows, rollout.max_segments) counts once: one score in the group statistics, the "
        "weight of one sequence in the loss under every algo.agg (rl/segments.py); "
        "unsegmented rollouts get the same numbers either way. False: each segment is a "
        "sequence of its own"),
    Key("critic_lr", 1e-3, NON_NEGATIVE, "the critic's learning rate (algo.name='ppo')"),
    Key("value_clip", 0.2, Real("(0, inf)", special=OFF), "the value loss's clip range "
        "(0: off)"),
    Key("critic_warmup_steps", 0, COUNT, "the first this many updates train only the "
        "critic (the policy is frozen)"),
    # Rollout-trainer mismatch corrections (rl/rollout_correction.py; presets by name:
    # config/algorithms.py ROLLOUT_CORRECTION_PRESETS; docs/operations.md).
    Key("rollout_correction.is_level", "token", Choice(IS_LEVELS), "the level of the "
        "algo.tis_cap weight: 'token' (each token's pi_trainer / pi_engine) or 'sequence' "
        "(the product over the episode's action tokens, on each of them: Seq-TIS)"),
    Key("rollout_correction.masks", "", CORRECTION_MASK_LIST, "rejection masks, ANDed: "
        "'token' (IcePop: a token whose ratio is outside [token_low, token_high] leaves "
        "the loss), 'geometric' (an episode whose geometric-mean ratio is outside "
        "[geo_low, geo_high]), 'product' (its product ratio outside [product_low, "
        "product_high]), 'seq_mean_kl' / 'seq_max_kl' (its mean / max per-token KL "
        "estimate above seq_mean_kl / seq_max_kl), 'opsm' (DeepSeek-V3.2: negative "
        "advantage and mean log(pi_engine / pi_trainer) above opsm_delta); '' none"),
    Key("rollout_correction.token_low", 0.5, Real("(0, 1]"), "the 'token' mask's lower "
        "ratio bound (IcePop's 0.5)"),
    Key("rollout_correction.token_high", 5.0, Real("[1, inf)"), "the 'token' mask's upper "
        "ratio bound (IcePop's 5)"),
    Key("rollout_correction.geo_low", 0.99, Real("(0, 1]"), "the 'geometric' mask's lower "
        "bound (SkyRL's recommended 0.99)"),
    Key("rollout_correction.geo_high", 1.01, Real("[1, inf)"), "the 'geometric' mask's "
        "upper bound (SkyRL's recommended 1.01)"),
    Key("rollout_correction.product_low", 0.5, Real("(0, 1]"), "the 'product' mask's "
        "lower bound (SkyRL's 0.5)"),
    Key("rollout_correction.product_high", 2.0, Real("[1, inf)"), "the 'product' mask's "
        "upper bound (SkyRL's 2)"),
    Key("rollout_correction.kl_estimator", "k3", Choice(KL_MASK_ESTIMATORS), "the "
        "per-token KL(engine || trainer) estimate of the KL masks: 'k2' (log r)^2 / 2 or "
        "'k3' r - 1 - log r"),
    Key("rollout_correction.seq_mean_kl", 0.01, POSITIVE_REAL, "the 'seq_mean_kl' mask's "
        "bound (verl's K3-RS: 0.01)"),
    Key("rollout_correction.seq_max_kl", 0.3, POSITIVE_REAL, "the 'seq_max_kl' mask's "
        "bound (0.3: k3 of a token ratio of about 2 or 0.4)"),
    Key("rollout_correction.opsm_delta", 1e-4, POSITIVE_REAL, "the 'opsm' mask's bound "
        "on an episode's mean log(pi_engine / pi_trainer) (slime's default 1e-4)"),
    Key("turn_gamma", 0.95, PROBABILITY, "the turn-level estimators' (gigpo, turn_rloo) "
        "discount per turn: a turn's return is its reward plus turn_gamma times the next "
        "turn's return (rl/turn_credit.py)"),
    Key("gigpo_weight", 1.0, NON_NEGATIVE, "gigpo: w in A = A_episode + w * A_step, the "
        "weight of the anchor-state step advantage (0: GRPO)"),
    Key("gigpo_norm", "mean", Choice(GIGPO_NORMS), "gigpo: both parts centered on their "
        "group's mean ('mean', verl-agent's mean_norm) or also divided by its std ('std')"),
    Key("turn_anchor", "context", Choice(TURN_ANCHORS), "gigpo: turns share an anchor "
        "state when the exact token ids before them are equal ('context') or the last "
        "observation's are ('observation'); core/anchors.py"),
    Key("turn_baseline", "episode", Choice(TURN_BASELINES), "turn_rloo: the leave-one-out "
        "baseline of a turn's return: the group's other episodes' returns from their start "
        "('episode') or from the same turn index, 0 once ended ('turn')"),
    # On-policy distillation (rl/distillation.py; docs/operations.md).
    Key("teacher", "", Path("folder", "an HF folder, or a run's workdir (its hf/ export)"),
        "on-policy distillation's teacher: a model of the policy's tokenizer that scores "
        "the policy's own samples (read with algo.distill_coef > 0)"),
    Key("distill_coef", 0.0, NON_NEGATIVE, "weight of the teacher's per-token signal log "
        "pi_teacher - log pi_student in the advantages, on action tokens, no discount "
        "(0: off; algo.name='opd': 1)"),
    Key("distill_task_weight", 1.0, NON_NEGATIVE, "with a teacher, the weight of the task "
        "reward's advantage (algo.advantage) beside it (algo.name='opd': 0, distillation "
        "alone)"),
)

OPTIM = Section(
    "optim", "The policy's optimizer: AdamW, global-norm clipping, a schedule. Schedules "
    "count optimizer updates (total_steps x ppo_epochs x minibatches per run).",
    Key("lr", 1e-3, POSITIVE_REAL, "the peak learning rate"),
    Key("schedule", "constant", Choice(SCHEDULES), "after the warmup: 'constant' or "
        "'cosine' decay to 0 at the end"),
    Key("warmup_steps", 0, COUNT, "updates of linear warmup from 0"),
    Key("weight_decay", 0.0, NON_NEGATIVE, "AdamW's decoupled weight decay"),
    Key("b1", 0.9, Real("[0, 1)"), "Adam's first-moment decay"),
    Key("b2", 0.99, Real("[0, 1)"), "Adam's second-moment decay"),
    Key("grad_clip", 1.0, Real("(0, inf)", special=OFF), "the global gradient norm is "
        "clipped to this (0: off)"),
    Key("on_nonfinite", "skip", Choice(ON_NONFINITE), "an update whose loss, gradient or "
        "new parameters are not finite is never applied; then 'skip' goes on with the "
        "next batch, 'rollback' also restores the policy of the last checkpoint"),
    Key("max_nonfinite_steps", 3, POSITIVE, "after this many consecutive steps with such "
        "an update the run saves a checkpoint and stops"),
)

RFT = Section(
    "rft", "stage='rft': rejection-sampling fine-tuning after SFT "
    "(train/stages/offline.py). total_steps optimizer steps in `rounds` rounds; each "
    "round rolls out rollout.group_size episodes of `tasks` training tasks with the "
    "current policy, keeps those whose reward reaches `min_reward` (each token sequence "
    "once) and trains the masked SFT loss on them (optim.lr).",
    Key("rounds", 4, POSITIVE, "rounds of rollouts and fine-tuning; they split total_steps"),
    Key("tasks", 128, POSITIVE, "training tasks a round rolls out"),
    Key("min_reward", 1.0, ANY_REAL, "an episode is kept when its reward reaches this"),
    Key("batch_size", 8, POSITIVE, "packed rows a step"),
    Key("accumulate", False, Flag(), "train on every round's kept episodes so far, not "
        "only the latest round's"),
    Key("data_path", "", Path("file", "an RFT set: JSONL of token_ids and action_mask"),
        "an RFT set of one's own (JSONL, data/offline_jsonl.py) added to every round"),
)

DPO = Section(
    "dpo", "stage='dpo': DPO on pairs of the policy's own episodes "
    "(train/stages/offline.py), against the policy DPO starts from as the frozen "
    "reference. A collection rolls out rollout.group_size episodes of `tasks` training "
    "tasks and pairs a successful episode with a failed one of the same task "
    "('trajectory'), and/or two episodes that share a prefix and diverge at one turn "
    "('turn', from branch rollouts). The loss: rl/preference.py; total_steps steps, "
    "optim.lr.",
    Key("beta", 0.1, POSITIVE_REAL, "the loss's inverse temperature on the log-ratios"),
    Key("kind", "sigmoid", Choice(DPO_KINDS), "'sigmoid' (DPO), 'ipo' or 'hinge' (SLiC)"),
    Key("label_smoothing", 0.0, Real("[0, 0.5]"), "the probability a pair's preference "
        "is flipped (conservative DPO; dpo.kind='sigmoid')"),
    Key("length_normalized", False, Flag(), "log-ratios averaged per action token "
        "instead of summed"),
    Key("pairs", "both", Choice(DPO_PAIRS), "which pairs a collection makes: "
        "'trajectory', 'turn' or 'both'"),
    Key("branches", 4, POSITIVE, "branch rollouts per task for turn-level pairs"),
    Key("pairs_per_task", 4, POSITIVE, "at most this many pairs of each kind per task"),
    Key("tasks", 256, POSITIVE, "training tasks a collection rolls out"),
    Key("min_reward", 1.0, ANY_REAL, "an episode is successful when its reward reaches "
        "this"),
    Key("batch_size", 16, POSITIVE, "pairs a step"),
    Key("refresh_every", 0, Integer(1, special=((0, "offline: pairs collected once"),)),
        "0 is offline DPO (pairs collected once, from the starting policy); n > 0 "
        "re-collects them from the current policy every n steps (online / iterative DPO)"),
    Key("data_path", "", Path("file", "preference pairs: JSONL of chosen and rejected "
                              "episodes"),
        "a pair file of one's own instead of collections (JSONL, data/offline_jsonl.py)"),
)

EVAL = Section(
    "eval", "Held-out evaluation.",
    Key("every", 20, Integer(1, special=ONLY_AFTER_THE_LAST_STEP), "steps between "
        "evaluations; the run also evaluates after its last step (0: only then)",
        resume=FREE),
    Key("num_tasks", 200, POSITIVE, "held-out tasks evaluated"),
    Key("samples", 4, Integer(1, special=((0, "greedy only"),)), "sampled attempts per "
        "task besides the greedy one (pass@k and sampled success); 0: greedy only"),
)

CHECKPOINT = Section(
    "checkpoint", "Checkpoints (a rerun with the same workdir resumes from the latest).",
    Key("every", 20, Integer(1, special=ONLY_AFTER_THE_LAST_STEP), "steps between "
        "checkpoints; the run also saves after its last step (0: only then)", resume=FREE),
    Key("keep", 2, POSITIVE, "checkpoints kept", resume=FREE),
    Key("async_save", True, Flag(), "checkpoints are written while training goes on",
        resume=FREE),
)

LOG = Section(
    "log", "What the run writes as it goes.",
    Key("every", 1, POSITIVE, "steps between metrics rows", resume=FREE),
    Key("tensorboard", True, Flag(), "metrics also as TensorBoard events", resume=FREE),
    Key("progress", True, Flag(), "progress bars", resume=FREE),
    Key("samples", 4, COUNT, "episodes written to <workdir>/samples/ per rollout step "
        "(0: none); also a table of the trackers that are on", resume=FREE),
    Key("name", "", ONE_LINE, "the run's name in the trackers ('': the workdir's folder "
        "name)", resume=FREE),
    Key("group", "", ONE_LINE, "the run's group in the trackers (W&B group, MLflow tag "
        "'group'); scripts/sweep.py sets it to the sweep's name", resume=FREE),
    Key("tags", "", TAGS, "the run's tags in the trackers (a 'key=value' tag is MLflow "
        "tag key=value); scripts/sweep.py sets the arm's overrides", resume=FREE),
    Key("artifacts", False, Flag(), "the final exported HF folder (and a LoRA run's "
        "adapter) also as an artifact of the trackers that are on", resume=FREE),
    # A tracker whose destination changes on resume starts a new run there
    # (train/tracking.py).
    Key("wandb.mode", "disabled", Choice(WANDB_MODES), "a Weights & Biases run: 'online', "
        "'offline' (files under <workdir>/wandb to `wandb sync`) or 'disabled' (needs "
        "`pip install wandb`)", resume=FREE),
    Key("wandb.project", "agentjax", NAME, "the W&B project", resume=FREE),
    Key("wandb.entity", "", NAME_OR_DEFAULT, "the W&B user or team the project belongs "
        "to", resume=FREE),
    Key("mlflow.tracking_uri", "", TRACKING_URI, "an MLflow run on this tracking server or "
        "store ('': none; needs `pip install mlflow-skinny`)", resume=FREE),
    Key("mlflow.experiment", "agentjax", TITLE, "the MLflow experiment the run belongs to "
        "(created if missing)", resume=FREE),
)

SECTIONS = (RUN, MODEL, TOKENIZER, DATA, ENV, RETRIEVAL, REWARD, PRETRAIN, SFT, ROLLOUT,
            ALGO, OPTIM, RFT, DPO, EVAL, CHECKPOINT, LOG)

# Keys that were renamed: old dotted key -> what to write instead. The old key is an error
# wherever it is given (an override, a config file, a saved config.json), never ignored.
RENAMED = {
    "env.mask_observations": "use env.loss_on_observations (inverted: "
                             "loss_on_observations=True is mask_observations=False)",
}


def _keys() -> dict[str, Key]:
    """Dotted key -> its Key, every key of the schema; a key defined twice is a bug."""
    keys = {}
    for section in SECTIONS:
        for key in section.keys:
            dotted = f"{section.name}.{key.name}" if section.name else key.name
            if dotted in keys:
                raise ValueError(f"config key {dotted!r} is defined twice in the schema")
            keys[dotted] = key
    return keys


KEYS = _keys()
# What each key allows: validate() checks every value against its key's rule.
RULES = {dotted: key.rule for dotted, key in KEYS.items()}
# What each key may do when a run resumes (config/resume.py).
ON_RESUME = {dotted: key.resume for dotted, key in KEYS.items()}


def default_config() -> ml_collections.ConfigDict:
    """Every key a run may set, with its default (a GRPO search agent on CPU), locked."""
    tree: dict = {}
    for dotted, key in KEYS.items():
        *sections, name = dotted.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = key.default
    config = ml_collections.ConfigDict(tree)
    config.lock()
    return config
