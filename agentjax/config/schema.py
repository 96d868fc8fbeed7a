"""The config schema every run starts from, and its validation.

Config files (`configs/*.py`) call `default_config()` and change values; the returned
ConfigDict is locked, so a misspelled key in a config file or a `--config.a.b=value`
override fails at once naming the key. `validate(config)` runs before anything is
built or compiled: it checks every key against its entry in RULES (type, range,
choices or format; NaN and infinities never pass) and then the combinations of keys,
and raises ConfigError, whose one-line message names the key, its value and what is
allowed.

Over 450 lines because the schema's three views are kept together: the defaults,
a rule per key (RULES; a test checks every key has exactly one) and the checks that
combine keys. The module imports nothing heavy, so it runs before jax is imported.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import sys
from typing import Callable

import ml_collections

from agentjax.config.choices import (
    ADVANTAGES,
    AGGREGATIONS,
    ARCHS,
    CURRICULA,
    DATA_SOURCES,
    DPO_KINDS,
    DPO_PAIRS,
    ENGINES,
    GUESSES,
    INSTRUCTIONS,
    IS_BOUNDS,
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
    STAGES,
)

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
ALGORITHMS = tuple(ALGORITHM_PRESETS)


def default_config() -> ml_collections.ConfigDict:
    """Every key a run may set, with its default (a GRPO search agent on CPU)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_steps = 60
    c.stage = "rl"  # "rl" | "sft" | "rft" | "dpo" (what follows SFT; see choices.STAGES)
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
    # Compute dtype of the policy, critic and reference forwards, of the rollout engine's
    # weights and KV cache, and of HF exports. The trainer's params and optimizer state
    # are float32 master weights whatever it is (no param-dtype key: a bfloat16 weight
    # ignores any update under 2^-9 of itself, so lr 1e-6 would train nothing).
    c.model.dtype = "float32"
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
    # A Search-R1 parquet's `prompt` column is what the agent sees (env.instruction then
    # applies only to tasks without one); False rebuilds every prompt from the question
    # with env.instruction (e.g. "minimal" for a tiny model trained from scratch).
    c.data.file_prompt = True
    # Rows of data.train_path/test_path that do not load (no answer, a repeated id, ...)
    # are an error naming them; True skips them with a warning instead.
    c.data.skip_bad_rows = False
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
    # Hindsight relabeling (synthetic search worlds): an RL group that solved nothing,
    # where some episode answered an intermediate entity of the question, trains as a
    # group for the shorter question it answered (agents/hindsight.py).
    c.data.hindsight = False

    c.env = ml_collections.ConfigDict()
    c.env.name = "search"
    c.env.topk = 3
    c.env.max_turns = 4
    c.env.max_observation_words = 120
    c.env.instruction = "short"  # "minimal" | "short" | "search_r1" (see suites.py)
    c.env.mask_observations = True  # False: observation tokens enter the loss (ablation)

    # latency_s: every search waits this long before answering, as a remote retrieval
    # server would (50-500 ms); benchmarks of the rollout against slow tools.
    c.retrieval = ml_collections.ConfigDict({"kind": "bm25", "url": "", "timeout_s": 10.0,
                                             "latency_s": 0.0})

    c.reward = ml_collections.ConfigDict()
    # The rewarded outcome: "em" (exact match), or for search "f1" or "judge" (an LLM
    # judge, below); held-out success is exact match whichever is rewarded.
    c.reward.outcome = "em"
    c.reward.format_weight = 0.0
    c.reward.tool_weight = 0.0
    c.reward.process_weight = 0.0
    # A linear penalty on turns beyond two (suites._reward_config); DAPO's overlong
    # shaping on the sampled tokens is algo.overlong_buffer.
    c.reward.length_weight = 0.0
    # reward.outcome="judge": an OpenAI-compatible chat server (SGLang, vLLM) grades each
    # episode against the task's reference answers (rewards/judge.py); `votes` replies per
    # episode, the majority decides; a judge that gives no verdict fails the episode.
    c.reward.judge = ml_collections.ConfigDict(
        {"url": "", "model": "", "votes": 1, "temperature": 0.0, "max_tokens": 256,
         "timeout_s": 60.0})

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
    c.rollout.engine = "jax"  # "jax" (in-process) | "sglang" (HTTP servers: train/engines.py)
    c.rollout.sglang = ml_collections.ConfigDict()
    c.rollout.sglang.urls = ""  # comma-separated server URLs (SGLang, a router, serve.py)
    c.rollout.sglang.launch = 0  # or: start this many local scripts/serve.py servers
    # Exported weight versions the servers load ('': <workdir>/weights); remote servers
    # need it on shared storage at the same path.
    c.rollout.sglang.weights_dir = ""
    # What the servers' log-probs are: "sampling" (after temperature and truncation, as
    # serve.py), "temperature" (SGLang's default: tempered, not truncated), "raw"
    # (SGLANG_RETURN_ORIGINAL_LOGPROB=1); "auto": sampling if launched, else temperature.
    c.rollout.sglang.logprob_distribution = "auto"
    # Servers given by URL that are scripts/serve.py keep each episode's KV cache between
    # turns when told its session (launched servers always are); SGLang's radix cache
    # needs no session, so leave it off there.
    c.rollout.sglang.server_sessions = False
    c.rollout.sglang.max_in_flight = 128  # requests per server
    c.rollout.sglang.grace_s = 120.0  # all servers down this long: save and stop
    c.rollout.sglang.startup_timeout_s = 600.0
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
    # Where each step's groups come from (agents/sources.py). "sync": rolled out
    # under the current weights, then trained on. "async": a producer thread keeps
    # `concurrency` episodes in flight while the learner updates; a group is trained at
    # most `max_staleness` weight versions after the oldest weights that sampled it
    # (0 gives exactly the sync run); at most `queue_groups` groups finished or in
    # flight (0: (max_staleness + 1) x prompts_per_step). partial_rollouts: episodes in
    # flight continue under new weights (their tokens carry mixed versions) instead of
    # new weights waiting until they finish.
    c.rollout.mode = "sync"
    c.rollout.max_staleness = 1
    c.rollout.queue_groups = 0
    c.rollout.partial_rollouts = False

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
    # How the weight is bounded: "truncate" min(ratio, tis_cap), "mask" 0 above tis_cap
    # (AReaL's behav_imp_weight_cap); rl/offpolicy.py.
    c.algo.tis_bound = "truncate"
    c.algo.dynamic_sampling = False
    c.algo.max_resample_rounds = 3
    # DAPO soft overlong punishment on the exact sampled (action) tokens of an episode,
    # added to its reward (train/stages/rl.py: shape_overlong); 0 disables.
    c.algo.overlong_buffer = 0
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
    # An optimizer update whose loss, gradient or new parameters are not finite is
    # never applied. Then "skip" goes on with the next batch; "rollback" also restores
    # the policy of the last checkpoint. After `max_nonfinite_steps` consecutive steps
    # with such an update the run saves a checkpoint and stops.
    c.optim.on_nonfinite = "skip"
    c.optim.max_nonfinite_steps = 3

    # stage="rft": rejection-sampling fine-tuning after SFT (train/stages/offline.py). total_steps
    # optimizer steps in `rounds` rounds; each round rolls out rollout.group_size
    # episodes of `tasks` training tasks with the current policy, keeps those whose
    # reward reaches `min_reward` (each token sequence once) and trains the masked SFT
    # loss on them (`batch_size` packed rows a step, optim.lr). `accumulate` trains on
    # every round's kept episodes so far; `data_path` adds an RFT set file of one's own
    # (JSONL, data/offline_jsonl.py) to every round.
    c.rft = ml_collections.ConfigDict(
        {"rounds": 4, "tasks": 128, "min_reward": 1.0, "batch_size": 8, "accumulate": False,
         "data_path": ""})
    # stage="dpo": DPO on pairs of the policy's own episodes (train/stages/offline.py), against
    # the policy DPO starts from as the frozen reference. A collection rolls out
    # rollout.group_size episodes of `tasks` training tasks and pairs a successful episode
    # (reward >= `min_reward`) with a failed one of the same task ("trajectory"), and/or
    # two episodes that share a prefix and diverge at one turn ("turn": `branches`
    # branch rollouts per task), at most `pairs_per_task` of each. refresh_every=0 is
    # offline DPO (pairs collected once, from the starting policy); n > 0 re-collects
    # them from the current policy every n steps (online / iterative DPO). `data_path`:
    # a pair file of one's own instead (JSONL, data/offline_jsonl.py). The loss:
    # rl/preference.py (`kind`, `beta`, `label_smoothing`, `length_normalized`);
    # `batch_size` pairs a step, total_steps steps, optim.lr.
    c.dpo = ml_collections.ConfigDict(
        {"beta": 0.1, "kind": "sigmoid", "label_smoothing": 0.0, "length_normalized": False,
         "pairs": "both", "branches": 4, "pairs_per_task": 4, "tasks": 256,
         "min_reward": 1.0, "batch_size": 16, "refresh_every": 0, "data_path": ""})

    c.eval = ml_collections.ConfigDict()
    c.eval.every = 20  # also evaluates after the last step; 0: only then
    c.eval.num_tasks = 200
    c.eval.samples = 4  # sampled attempts per task (pass@k and sampled success)

    c.checkpoint = ml_collections.ConfigDict({"every": 20, "keep": 2, "async_save": True})
    # samples: episodes written to <workdir>/samples/ per rollout step (0: none).
    c.log = ml_collections.ConfigDict({"every": 1, "tensorboard": True, "progress": True,
                                       "samples": 4})
    c.lock()
    return c


class ConfigError(ValueError):
    """A config value no run can use. The message is one line naming the key, the value
    and what is allowed; the scripts print it as `error: <message>` and exit with
    status 2, without a traceback."""


def exit_on_config_error(main: Callable) -> Callable:
    """Wraps a script's `main(argv)`: a ConfigError prints `error: <message>` on stderr
    (one line, no traceback) and exits with status 2, before anything is built."""

    @functools.wraps(main)
    def guarded(argv):
        try:
            return main(argv)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    return guarded


def _reject(key: str, value, requirement: str):
    raise ConfigError(f"config key {key!r} is {value!r}; {requirement}")


# ------------------------------------------------------------- what each key allows


@dataclasses.dataclass(frozen=True)
class Integer:
    """An integer >= low (and <= high unless None), or one of `special`: (value, what it
    means) pairs."""

    low: int
    high: int | None = None
    special: tuple[tuple[int, str], ...] = ()

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        in_range = value >= self.low and (self.high is None or value <= self.high)
        return in_range or value in dict(self.special)

    @property
    def allowed(self) -> str:
        bounds = (f"an integer >= {self.low}" if self.high is None
                  else f"an integer in [{self.low}, {self.high}]")
        return ", or ".join([bounds] + [f"{v} ({meaning})" for v, meaning in self.special])


@dataclasses.dataclass(frozen=True)
class Real:
    """A finite number in `interval`, written "[0, 1)" / "(0, inf)" (a bracket includes
    its bound, a parenthesis excludes it; inf is never included), or one of `special`.
    NaN and infinities are never allowed."""

    interval: str
    special: tuple[tuple[float, str], ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"[\[(][^,]+, [^,]+[\])]", self.interval):
            raise ValueError(f"Real interval {self.interval!r} is not like '[0, 1)'")

    @property
    def bounds(self) -> tuple[float, float]:
        low, high = self.interval[1:-1].split(", ")
        return float(low), float(high)

    @property
    def closed(self) -> tuple[bool, bool]:
        return self.interval[0] == "[", self.interval[-1] == "]"

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if value in dict(self.special):
            return True
        (low, high), (low_closed, high_closed) = self.bounds, self.closed
        above = value >= low if low_closed else value > low
        below = value <= high if high_closed else value < high
        return above and below

    @property
    def allowed(self) -> str:
        return ", or ".join([f"a finite number in {self.interval}"]
                            + [f"{v} ({meaning})" for v, meaning in self.special])


@dataclasses.dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def allows(self, value) -> bool:
        return value in self.options

    @property
    def allowed(self) -> str:
        return f"one of {list(self.options)}"


@dataclasses.dataclass(frozen=True)
class Flag:
    def allows(self, value) -> bool:
        return isinstance(value, bool)

    allowed = "True or False"


@dataclasses.dataclass(frozen=True)
class Text:
    """A string `check` accepts; `allowed` says which in words."""

    allowed: str
    check: Callable[[str], bool]

    def allows(self, value) -> bool:
        return isinstance(value, str) and self.check(value)


@dataclasses.dataclass(frozen=True)
class Path:
    """"" (none) or an existing `kind` ("folder" or "file") on this machine."""

    kind: str
    what: str

    def allows(self, value) -> bool:
        exists = os.path.isdir if self.kind == "folder" else os.path.isfile
        return isinstance(value, str) and (value == "" or exists(value))

    @property
    def allowed(self) -> str:
        return f"'' or an existing {self.kind} ({self.what})"


def _entries(text: str) -> list[tuple[str, str]] | None:
    """"1:400, 2:0.5" -> [("1", "400"), ("2", "0.5")]; None when an entry lacks its ':'."""
    parts = [p.strip() for p in text.split(",")]
    if not all(":" in p for p in parts):
        return None
    return [tuple(s.strip() for s in p.split(":", 1)) for p in parts]


def _hop_counts(text: str) -> bool:
    entries = _entries(text)
    return bool(entries) and all(
        hops in ("1", "2", "3", "4") and count.isdigit() for hops, count in entries
    ) and sum(int(count) for _, count in entries) > 0


def _hop_fractions(text: str) -> bool:
    if text == "":
        return True
    entries = _entries(text)

    def fraction(value: str) -> bool:
        try:
            return 0.0 <= float(value) <= 1.0
        except ValueError:
            return False

    return bool(entries) and all(hops in ("1", "2", "3", "4") and fraction(value)
                                 for hops, value in entries)


def _json_object(text: str) -> bool:
    if text == "":
        return True
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _url(text: str) -> bool:
    return re.fullmatch(r"https?://[^\s,]+", text) is not None


def _name(text: str) -> bool:
    return text == "" or re.fullmatch(r"\S+", text) is not None


def _host_port(text: str) -> bool:
    return text == "" or re.fullmatch(r"[^\s:]+:\d+", text) is not None


HOP_COUNTS = Text("comma-separated 'hops:count' entries (hops 1..4, counts >= 0, "
                  "at least one question), e.g. '1:400,2:400'", _hop_counts)
HOP_FRACTIONS = Text("'' (demonstrate every training question) or comma-separated "
                     "'hops:fraction' entries (hops 1..4, fractions in [0, 1]), e.g. "
                     "'1:0.85,2:0.85'", _hop_fractions)
JSON_OBJECT = Text("'' or a JSON object of logical axis -> mesh axes, e.g. "
                   "'{\"embed\": null}'", _json_object)
URL = Text("'' or an http(s):// URL", lambda text: text == "" or _url(text))
URLS = Text("'' or comma-separated http(s):// URLs",
            lambda text: text == "" or all(_url(u.strip()) for u in text.split(",")))
TEMPLATE_KWARGS = Text("'' or a JSON object of chat-template variables, e.g. "
                       "'{\"enable_thinking\": false}'", _json_object)
HOST_PORT = Text("'' or 'host:port'", _host_port)
FOLDER_TO_CREATE = Text("'' or a folder path (created if missing)",
                        lambda text: "\0" not in text)
SERVED_MODEL = Text("'' or the model name a server serves (no whitespace)", _name)

# The byte alphabet (256), the chat control tokens and the agent tags of a tokenizer
# built for a tiny model (models.tokenizer.build_tokenizer) need this many ids.
MIN_TINY_VOCAB = 269
DTYPES = ("float32", "bfloat16")

POSITIVE = Integer(1)
COUNT = Integer(0)
PROBABILITY = Real("[0, 1]")
NON_NEGATIVE = Real("[0, inf)")
POSITIVE_REAL = Real("(0, inf)")
ANY_REAL = Real("(-inf, inf)")

# What every key of default_config() allows. validate() checks each key against its
# entry (a key without one is a bug that tests/config/test_schema.py catches), then the
# combinations of keys.
RULES = {
    "seed": COUNT,
    "total_steps": POSITIVE,
    "stage": Choice(STAGES),
    "init_from": Path("folder", "a run's workdir, checkpoint folder or HF folder"),
    **{f"mesh.{axis}": Integer(1, special=((-1, "the remaining devices"),))
       for axis in ("data", "fsdp", "tensor")},
    "rules": JSON_OBJECT,
    "multihost.enabled": Flag(),
    "multihost.coordinator": HOST_PORT,
    "multihost.num_processes": POSITIVE,
    "multihost.process_id": Integer(0, special=((-1, "from the cluster environment"),)),
    "model.path": Path("folder", "a local HF checkpoint"),
    "model.arch": Choice(ARCHS),
    "model.hidden_size": POSITIVE,
    "model.num_layers": POSITIVE,
    "model.num_heads": POSITIVE,
    "model.num_kv_heads": POSITIVE,
    "model.intermediate_size": POSITIVE,
    "model.dtype": Choice(DTYPES),
    "model.remat": Choice(REMAT_POLICIES),
    "model.logprob_chunk": POSITIVE,
    "tokenizer.path": Path("folder", "a tokenizer"),
    "tokenizer.template_kwargs": TEMPLATE_KWARGS,
    "tokenizer.vocab_size": Integer(MIN_TINY_VOCAB, special=((0, "the loaded model's"),)),
    "data.source": Choice(DATA_SOURCES),
    "data.train_path": Path("file", "Search-R1 parquet or jsonl"),
    "data.test_path": Path("file", "Search-R1 parquet or jsonl"),
    "data.corpus_path": Path("file", "Search-R1 corpus jsonl"),
    "data.world_seed": COUNT,
    # A world needs two entities of each type (data.world.WorldConfig).
    "data.num_people": Integer(2),
    "data.num_companies": Integer(2),
    "data.num_cities": Integer(2),
    "data.num_countries": Integer(2),
    "data.train_questions": HOP_COUNTS,
    "data.test_questions": HOP_COUNTS,
    "data.demo_hops": HOP_FRACTIONS,
    "data.rl_excludes_demo_tasks": Flag(),
    "data.file_prompt": Flag(),
    "data.skip_bad_rows": Flag(),
    "data.curriculum": Choice(CURRICULA),
    "data.hindsight": Flag(),
    "env.name": Choice(tuple(OUTCOMES)),
    "env.topk": POSITIVE,
    "env.max_turns": POSITIVE,
    "env.max_observation_words": POSITIVE,
    "env.instruction": Choice(INSTRUCTIONS),
    "env.mask_observations": Flag(),
    "retrieval.kind": Choice(RETRIEVERS),
    "retrieval.url": URL,
    "retrieval.timeout_s": POSITIVE_REAL,
    "retrieval.latency_s": NON_NEGATIVE,
    "reward.outcome": Choice(tuple(dict.fromkeys(o for by_env in OUTCOMES.values()
                                                 for o in by_env))),
    "reward.format_weight": NON_NEGATIVE,
    "reward.tool_weight": NON_NEGATIVE,
    "reward.process_weight": NON_NEGATIVE,
    "reward.length_weight": NON_NEGATIVE,
    "reward.judge.url": URL,
    "reward.judge.model": SERVED_MODEL,
    "reward.judge.votes": POSITIVE,
    "reward.judge.temperature": NON_NEGATIVE,
    "reward.judge.max_tokens": POSITIVE,
    "reward.judge.timeout_s": POSITIVE_REAL,
    "pretrain.steps": COUNT,
    "pretrain.worlds": COUNT,
    "pretrain.batch_size": POSITIVE,
    "pretrain.lr": POSITIVE_REAL,
    "sft.steps": COUNT,
    "sft.batch_size": POSITIVE,
    "sft.lr": POSITIVE_REAL,
    "sft.num_demos": POSITIVE,
    "sft.guess_prob": PROBABILITY,
    "sft.guess": Choice(GUESSES),
    "sft.repeat_prob": PROBABILITY,
    "sft.early_stop_prob": PROBABILITY,
    "sft.poor_query_prob": PROBABILITY,
    "sft.negative_frac": PROBABILITY,
    "sft.corpus_mix": Real("[0, 1)"),
    "sft.rename_frac": PROBABILITY,
    "rollout.engine": Choice(ENGINES),
    "rollout.sglang.urls": URLS,
    "rollout.sglang.launch": COUNT,
    "rollout.sglang.weights_dir": FOLDER_TO_CREATE,
    "rollout.sglang.logprob_distribution": Choice(("auto",) + LOGPROB_DISTRIBUTIONS),
    "rollout.sglang.server_sessions": Flag(),
    "rollout.sglang.max_in_flight": POSITIVE,
    "rollout.sglang.grace_s": POSITIVE_REAL,
    "rollout.sglang.startup_timeout_s": POSITIVE_REAL,
    "rollout.prompts_per_step": POSITIVE,
    "rollout.group_size": POSITIVE,
    "rollout.temperature": NON_NEGATIVE,
    "rollout.final_temperature": NON_NEGATIVE,
    "rollout.top_p": Real("(0, 1]"),
    "rollout.top_k": Integer(1, special=((-1, "no top-k cut"),)),
    "rollout.max_new_tokens": POSITIVE,
    "rollout.max_tokens": Integer(2),
    "rollout.concurrency": POSITIVE,
    "rollout.engine_slots": POSITIVE,
    "rollout.engine_lanes": POSITIVE,
    "rollout.decode_steps": POSITIVE,
    "rollout.deterministic": Flag(),
    "rollout.episode_timeout_s": POSITIVE_REAL,
    "rollout.mode": Choice(ROLLOUT_MODES),
    "rollout.max_staleness": COUNT,
    "rollout.queue_groups": Integer(1, special=(
        (0, "(rollout.max_staleness + 1) x rollout.prompts_per_step"),)),
    "rollout.partial_rollouts": Flag(),
    "algo.name": Choice(ALGORITHMS),
    "algo.advantage": Choice(ADVANTAGES),
    "algo.loss": Choice(POLICY_LOSSES),
    "algo.clip_low": PROBABILITY,
    "algo.clip_high": NON_NEGATIVE,
    "algo.dual_clip": Real("(1, inf)", special=((0, "off"),)),
    "algo.agg": Choice(AGGREGATIONS),
    "algo.agg_constant": Real("(0, inf)", special=((0, "the bucket length"),)),
    "algo.kl_coef": NON_NEGATIVE,
    "algo.kl_kind": Choice(KL_KINDS),
    "algo.kl_in_reward": Flag(),
    "algo.entropy_coef": NON_NEGATIVE,
    "algo.gamma": PROBABILITY,
    "algo.lam": PROBABILITY,
    "algo.ppo_epochs": POSITIVE,
    "algo.minibatches": POSITIVE,
    "algo.microbatch_size": Integer(1, special=((0, "the whole minibatch"),)),
    "algo.old_logp": Choice(OLD_LOGP),
    "algo.tis_cap": Real("(0, inf)", special=((0, "off"),)),
    "algo.tis_bound": Choice(IS_BOUNDS),
    "algo.dynamic_sampling": Flag(),
    "algo.max_resample_rounds": COUNT,
    "algo.overlong_buffer": Integer(1, special=((0, "off"),)),
    "algo.overlong_max_len": POSITIVE,
    "algo.overlong_factor": NON_NEGATIVE,
    "algo.critic_lr": NON_NEGATIVE,
    "algo.value_clip": Real("(0, inf)", special=((0, "off"),)),
    "algo.critic_warmup_steps": COUNT,
    "rft.rounds": POSITIVE,
    "rft.tasks": POSITIVE,
    "rft.min_reward": ANY_REAL,
    "rft.batch_size": POSITIVE,
    "rft.accumulate": Flag(),
    "rft.data_path": Path("file", "an RFT set: JSONL of token_ids and action_mask"),
    "dpo.beta": POSITIVE_REAL,
    "dpo.kind": Choice(DPO_KINDS),
    "dpo.label_smoothing": Real("[0, 0.5]"),
    "dpo.length_normalized": Flag(),
    "dpo.pairs": Choice(DPO_PAIRS),
    "dpo.branches": POSITIVE,
    "dpo.pairs_per_task": POSITIVE,
    "dpo.tasks": POSITIVE,
    "dpo.min_reward": ANY_REAL,
    "dpo.batch_size": POSITIVE,
    "dpo.refresh_every": Integer(1, special=((0, "offline: pairs collected once"),)),
    "dpo.data_path": Path("file", "preference pairs: JSONL of chosen and rejected episodes"),
    "optim.lr": POSITIVE_REAL,
    "optim.schedule": Choice(SCHEDULES),
    "optim.warmup_steps": COUNT,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.b1": Real("[0, 1)"),
    "optim.b2": Real("[0, 1)"),
    "optim.grad_clip": Real("(0, inf)", special=((0, "off"),)),
    "optim.on_nonfinite": Choice(ON_NONFINITE),
    "optim.max_nonfinite_steps": POSITIVE,
    "eval.every": Integer(1, special=((0, "only after the last step"),)),
    "eval.num_tasks": POSITIVE,
    "eval.samples": Integer(1, special=((0, "greedy only"),)),
    "checkpoint.every": Integer(1, special=((0, "only after the last step"),)),
    "checkpoint.keep": POSITIVE,
    "checkpoint.async_save": Flag(),
    "log.every": POSITIVE,
    "log.tensorboard": Flag(),
    "log.progress": Flag(),
    "log.samples": COUNT,
}


# ------------------------------------------------------------------------ validation


def _walk(reference, config, path=""):
    """Yields (path, reference_value, value) for every leaf; unknown keys raise."""
    for key in config.keys():
        where = f"{path}{key}"
        if key not in reference:
            raise ConfigError(f"unknown config key {where!r}; known keys under "
                              f"{path or 'the root'}: {sorted(reference.keys())}")
        ref, val = reference[key], config[key]
        if isinstance(ref, ml_collections.ConfigDict):
            if not isinstance(val, (ml_collections.ConfigDict, dict)):
                _reject(where, val, "it must be a section")
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
        _reject(where, val, f"it must be of type {type(ref).__name__}, not "
                            f"{type(val).__name__}")


def _get(config, dotted: str):
    for name in dotted.split("."):
        config = config[name]
    return config


def is_run_folder(workdir: str) -> bool:
    """Whether `workdir` holds a run: the config.json every run saves first."""
    return os.path.isfile(os.path.join(workdir, "config.json"))


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
    """Checks every key against RULES, then the combinations of keys; returns the config.

    Raises:
      ConfigError: an unknown key, a wrong type, a value outside its key's range, or an
        impossible combination; the message names the key.
      LookupError: a key of default_config() has no entry in RULES (a bug).
    """
    for where, ref, val in _walk(default_config(), config):
        _check_type(where, ref, val)
        if where not in RULES:
            raise LookupError(f"config key {where!r} has no entry in config.RULES")
        if not RULES[where].allows(val):
            _reject(where, val, f"allowed: {RULES[where].allowed}")
    _check_combinations(config)
    return config


def _check_combinations(config) -> None:
    """The checks that involve several keys (each key is already in its range)."""
    algo, rollout, data = config.algo, config.rollout, config.data
    if config.reward.outcome not in OUTCOMES[config.env.name]:
        _reject("reward.outcome", config.reward.outcome,
                f"with env.name={config.env.name!r} choose one of "
                f"{sorted(OUTCOMES[config.env.name])}")
    _check_judge(config.reward)
    searches_synthetic_world = (config.env.name, data.source) == ("search", "synthetic")
    for key in ("pretrain.steps", "sft.corpus_mix"):
        if _get(config, key) and not searches_synthetic_world:
            _reject(key, _get(config, key), "> 0 needs the text corpus of a synthetic "
                    "search world (env.name='search', data.source='synthetic')")
        if _get(config, key) and config.pretrain.worlds < 1:
            _reject(key, _get(config, key), "> 0 needs pretrain.worlds >= 1 (the corpus)")
    if data.hindsight and not searches_synthetic_world:
        _reject("data.hindsight", True, "it relabels the questions of a synthetic search "
                "world: it needs env.name='search' and data.source='synthetic'")
    if config.sft.rename_frac and not searches_synthetic_world:
        _reject("sft.rename_frac", config.sft.rename_frac,
                "> 0 renames the entities of a synthetic search world: it needs "
                "env.name='search' and data.source='synthetic'")
    if config.stage == "sft" and config.sft.steps == 0:
        _reject("sft.steps", 0, "stage='sft' needs sft.steps > 0")
    _check_offline(config)

    if searches_synthetic_world and data.num_cities < data.num_countries:
        _reject("data.num_cities", data.num_cities,
                f"every country needs a capital among its cities: it must be >= "
                f"data.num_countries={data.num_countries}")
    if data.source == "files" and not data.train_path:
        _reject("data.train_path", "", "data.source='files' needs it")
    if (config.env.name, data.source, config.retrieval.kind) == ("search", "files", "bm25") \
            and not data.corpus_path:
        _reject("data.corpus_path", "", "data.source='files' with retrieval.kind='bm25' "
                "needs the Search-R1 corpus jsonl to index")
    if config.retrieval.kind == "http" and not config.retrieval.url:
        _reject("retrieval.url", "", "retrieval.kind='http' needs it")

    builds_tiny_model = not (config.init_from or config.model.path)
    if builds_tiny_model and config.tokenizer.vocab_size == 0:
        _reject("model.path", "", "this config loads a pretrained model "
                "(tokenizer.vocab_size=0): pass --config.model.path=/path/to/hf/folder")
    model = config.model
    if builds_tiny_model and model.hidden_size % model.num_heads:
        _reject("model.num_heads", model.num_heads,
                f"it must divide model.hidden_size={model.hidden_size}")
    if builds_tiny_model and model.num_heads % model.num_kv_heads:
        _reject("model.num_kv_heads", model.num_kv_heads,
                f"it must divide model.num_heads={model.num_heads}")

    if (algo.advantage == "gae") != (algo.name == "ppo"):
        _reject("algo.advantage", algo.advantage, f"'gae' goes with algo.name='ppo' (a "
                f"critic), and only with it; algo.name is {algo.name!r}")
    if algo.name == "ppo" and algo.critic_lr == 0:
        _reject("algo.critic_lr", algo.critic_lr, "algo.name='ppo' needs a critic: > 0")
    group_based = algo.advantage in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
    if group_based and rollout.group_size < 2:
        _reject("rollout.group_size", rollout.group_size,
                f"algo.advantage={algo.advantage!r} compares samples within a group: "
                "it must be >= 2")
    if algo.dynamic_sampling and not group_based:
        _reject("algo.dynamic_sampling", True, "it filters zero-variance groups: it needs "
                "a group-based algo.advantage")
    if data.hindsight and not group_based:
        _reject("data.hindsight", True, "it keeps a relabeled group when its rewards "
                "differ: it needs a group-based algo.advantage")
    if data.hindsight and algo.old_logp == "behavior":
        _reject("data.hindsight", True, "relabeled episodes were sampled under another "
                "prompt, so the old log-probs must be recomputed: it needs "
                "algo.old_logp='recompute'")
    if algo.overlong_buffer > algo.overlong_max_len:
        _reject("algo.overlong_buffer", algo.overlong_buffer,
                f"it must not exceed algo.overlong_max_len={algo.overlong_max_len}")

    batch = rollout.prompts_per_step * rollout.group_size
    if batch % algo.minibatches:
        _reject("algo.minibatches", algo.minibatches, f"it must divide the rollout batch "
                f"rollout.prompts_per_step x rollout.group_size = {batch}")
    minibatch = batch // algo.minibatches
    if algo.microbatch_size and minibatch % algo.microbatch_size:
        _reject("algo.microbatch_size", algo.microbatch_size,
                f"it must divide the minibatch size {minibatch}")
    if rollout.engine_slots % rollout.engine_lanes:
        _reject("rollout.engine_lanes", rollout.engine_lanes,
                f"rollout.engine_slots={rollout.engine_slots} must split evenly over it")
    if rollout.engine == "jax" and rollout.concurrency > rollout.engine_slots:
        _reject("rollout.concurrency", rollout.concurrency,
                f"it exceeds rollout.engine_slots={rollout.engine_slots}: sessions would "
                "be evicted and re-prefilled")
    if rollout.max_new_tokens >= rollout.max_tokens:
        _reject("rollout.max_new_tokens", rollout.max_new_tokens,
                f"it must be < rollout.max_tokens={rollout.max_tokens} (the context "
                "holds the prompt too)")
    _check_sglang(config)
    if rollout.mode == "async":
        _check_async(config)

    mesh_sizes = dict(config.mesh)
    if list(mesh_sizes.values()).count(-1) > 1:
        _reject("mesh", mesh_sizes, "at most one axis may be -1 (the remaining devices)")
    if config.multihost.enabled and not (config.multihost.coordinator
                                         and config.multihost.num_processes > 1):
        _reject("multihost.enabled", True,
                "it needs multihost.coordinator and multihost.num_processes > 1")
    if config.multihost.process_id >= config.multihost.num_processes:
        _reject("multihost.process_id", config.multihost.process_id,
                f"it must be < multihost.num_processes={config.multihost.num_processes}")


def _check_offline(config) -> None:
    """The RFT and DPO stages: one optimizer update per step, rounds that split the
    steps, micro-batches that split a step's rows, options that go together."""
    algo, stage = config.algo, config.stage
    if stage not in ("rft", "dpo"):
        return
    for key in ("ppo_epochs", "minibatches"):
        if algo[key] != 1:
            _reject(f"algo.{key}", algo[key], f"stage={stage!r} makes one optimizer update "
                    "per step: it must be 1")
    section = config[stage]
    if algo.microbatch_size and section.batch_size % algo.microbatch_size:
        _reject("algo.microbatch_size", algo.microbatch_size,
                f"it must divide {stage}.batch_size={section.batch_size}")
    if stage == "rft" and config.total_steps % section.rounds:
        _reject("rft.rounds", section.rounds, f"it must divide total_steps="
                f"{config.total_steps} (each round trains as many steps)")
    if stage == "dpo":
        if section.label_smoothing and section.kind != "sigmoid":
            _reject("dpo.label_smoothing", section.label_smoothing,
                    f"only dpo.kind='sigmoid' has one (dpo.kind is {section.kind!r})")
        if section.data_path and section.refresh_every:
            _reject("dpo.refresh_every", section.refresh_every, "the pairs of dpo.data_path "
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
        for key in ("urls", "launch"):
            if s[key]:
                _reject(f"rollout.sglang.{key}", s[key],
                        "it is used only with rollout.engine='sglang'")
        return
    if bool(s.urls) == bool(s.launch):
        _reject("rollout.engine", "sglang", "it needs exactly one of rollout.sglang.urls "
                "(running servers) and rollout.sglang.launch > 0 (local servers)")
    if config.multihost.enabled:
        _reject("rollout.engine", "sglang", "weights are not synced to servers from a "
                "multi-host run yet; use 'jax'")
    # The behavior log-probs enter the loss through the TIS weights (tis_cap) or as the
    # old policy (old_logp='behavior'): they must be of the distribution sampled from.
    if not (algo.old_logp == "behavior" or algo.tis_cap > 0):
        return
    distribution = sglang_logprob_distribution(config)
    tempered = rollout.temperature != 1.0 or rollout.final_temperature != 1.0
    truncated = rollout.top_p < 1.0 or rollout.top_k > 0
    if distribution == "raw" and tempered:
        _reject("rollout.sglang.logprob_distribution", "raw", "the servers' log-probs are "
                "before temperature but rollout.temperature is not 1, and algo.old_logp="
                "'behavior' or algo.tis_cap uses them; unset SGLANG_RETURN_ORIGINAL_LOGPROB "
                "on the servers or set algo.tis_cap=0 with algo.old_logp='recompute'")
    if distribution == "temperature" and truncated:
        _reject("rollout.sglang.logprob_distribution", s.logprob_distribution,
                "SGLang's log-probs are not truncated by top_p / top_k, which this run "
                "samples with, and algo.old_logp='behavior' or algo.tis_cap uses them; set "
                "rollout.top_p=1 and rollout.top_k=-1, or algo.tis_cap=0 with "
                "algo.old_logp='recompute'")


def _check_judge(reward) -> None:
    """reward.judge is complete when the judge is the outcome, and unused otherwise."""
    judge = reward.judge
    if reward.outcome == "judge":
        if not judge.url:
            _reject("reward.judge.url", "", "reward.outcome='judge' needs the judge's "
                    "OpenAI-compatible chat server, e.g. 'http://127.0.0.1:30000'")
        if not judge.model:
            _reject("reward.judge.model", "", "reward.outcome='judge' needs the model name "
                    "the judge server serves")
    elif judge.url:
        _reject("reward.judge.url", judge.url, "it is used only with reward.outcome='judge' "
                f"(reward.outcome is {reward.outcome!r})")
    if judge.votes > 1 and judge.temperature == 0:
        _reject("reward.judge.votes", judge.votes, "several votes at "
                "reward.judge.temperature=0 repeat one greedy verdict: set a temperature > 0")


def _check_async(config) -> None:
    """What rollout.mode='async' needs beyond each key's range."""
    rollout = config.rollout
    if config.stage != "rl":
        _reject("rollout.mode", "async", f"it drives the RL stage's rollouts, and "
                f"stage={config.stage!r} has none of its own: use rollout.mode='sync'")
    if config.algo.dynamic_sampling:
        _reject("algo.dynamic_sampling", True, "rollout.mode='async' does not filter "
                "groups yet: use rollout.mode='sync' for dynamic sampling")
    if rollout.final_temperature != rollout.temperature:
        _reject("rollout.final_temperature", rollout.final_temperature,
                f"rollout.mode='async' trains groups sampled at other steps together: it "
                f"must equal rollout.temperature={rollout.temperature}")
    if rollout.concurrency < rollout.group_size:
        _reject("rollout.concurrency", rollout.concurrency,
                f"rollout.mode='async' starts whole groups: it must be >= "
                f"rollout.group_size={rollout.group_size}")
    if rollout.queue_groups and rollout.queue_groups < rollout.prompts_per_step:
        _reject("rollout.queue_groups", rollout.queue_groups,
                f"an update takes rollout.prompts_per_step={rollout.prompts_per_step} "
                "groups from the queue: it must hold at least that many")
    if config.data.hindsight:
        _reject("data.hindsight", True, "rollout.mode='async' does not relabel groups yet: "
                "use rollout.mode='sync' for hindsight relabeling")
    if config.multihost.enabled:
        _reject("rollout.mode", "async", "every host would train on the groups its own "
                "timing produced: multi-host runs need rollout.mode='sync'")


def apply_algorithm(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Sets config.algo.name and the settings that define algorithm `name`."""
    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHM_PRESETS)}")
    config.algo.name = name
    for key, value in ALGORITHM_PRESETS[name].items():
        config.algo[key] = value
    return config
