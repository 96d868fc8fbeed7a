"""The trainer: SFT warm-start, then RL, with evaluation, checkpoints and metrics.

    results = Trainer(config, workdir).run()

Sections, in the order a run meets them:
  1. setup      validate config, mesh, task suite, tokenizer + model, engine + pool
  2. SFT        next-token loss on a text corpus (config.pretrain.steps > 0), then
                masked next-token loss on demonstrations (config.sft.steps > 0), corpus
                documents mixed in (config.sft.corpus_mix): train/stages/sft.py
  3. RL         sample tasks -> roll out groups -> prepare (log-probs, advantages)
                -> jitted update -> sync weights to the engine, then the hooks due:
                evaluate / log / checkpoint: train/stages/rl.py; or instead (stage "rft",
                "dpo") rejection-sampling fine-tuning or DPO on the policy's own
                episodes: train/stages/offline.py
  4. report     held-out success of the demonstrator, the SFT agent and the RL (RFT,
                DPO) agent

Resume: every stage checkpoints into the workdir (orbax: device state; json: sampler
and step); rerunning with the same `--workdir` continues where the run stopped, with
the same data order and random streams. What a rerun reads back is written atomically
(agentjax.core.atomic; orbax commits checkpoints by renaming), and which stage is done is
decided from committed checkpoints and sft/eval.json, never from a folder's existence:
a kill at any point, repeated any number of times, gives the uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from agentjax.core import atomic
from agentjax.core import parallel
from agentjax.models import Decoder, ModelConfig, load_hf, save_hf
from agentjax.models.tokenizer import AGENT_TAGS, build_tokenizer, load_tokenizer, prompt_ids
from agentjax.agents.loop import EpisodeLimits
from agentjax.engine.protocol import SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.train.stages import offline
from agentjax.train.stages import rl as rl_loop
from agentjax.train.stages import sft
from agentjax.train.checkpoint import Checkpointer, latest_committed_step
from agentjax.config.schema import ConfigError, validate
from agentjax.train.engines import build_engine
from agentjax.train.episodes import EpisodeRecorder, check_failures
from agentjax.agents.evaluation import evaluate, group_of
from agentjax.train.memory import memory_plan
from agentjax.train.metrics import MetricsWriter
from agentjax.train.precision import model_precision
from agentjax.config.preflight import check_runtime
from agentjax.train.stages.rl import TrainingDiverged, temperature_at
from agentjax.envs.registry import build_suite

# TrainingDiverged is raised by the RL stage; scripts/train.py catches it from here.
__all__ = ["HF_DIR", "CHECKPOINTS", "Trainer", "TrainingDiverged", "length_buckets",
           "report_table"]

HF_DIR = "hf"  # every stage exports its final policy here (init_from / SGLang / eval)
CHECKPOINTS = "checkpoints"  # in the workdir (RL) or in <workdir>/<stage> (pretrain, sft)


def length_buckets(max_tokens: int, count: int = 4, multiple: int = 32) -> tuple[int, ...]:
    """`count` collate lengths up to max_tokens, so jit sees at most `count` shapes."""
    sizes = {max(multiple, -(-max_tokens * (i + 1) // count // multiple) * multiple)
             for i in range(count)}
    return tuple(sorted(min(s, max_tokens) for s in sizes))


class Trainer:
    """One run of `config` in `workdir` (see the module docstring)."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        self.started = time.perf_counter()
        self.config = validate(config)
        check_runtime(config)
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        if config.multihost.enabled:
            parallel.initialize_distributed({
                "coordinator_address": config.multihost.coordinator,
                "num_processes": config.multihost.num_processes,
                "process_id": None if config.multihost.process_id < 0
                else config.multihost.process_id})
        self.is_main = jax.process_index() == 0
        if self.is_main:
            atomic.write_text(os.path.join(self.workdir, "config.json"),
                              config.to_json_best_effort(indent=1))
        self.mesh = parallel.make_mesh(dict(config.mesh))
        data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        row_counts = {"rollout.prompts_per_step x rollout.group_size":
                      config.rollout.prompts_per_step * config.rollout.group_size,
                      "sft.batch_size": config.sft.batch_size}
        if config.pretrain.steps:
            row_counts["pretrain.batch_size"] = config.pretrain.batch_size
        if config.stage in ("rft", "dpo"):
            row_counts[f"{config.stage}.batch_size"] = config[config.stage].batch_size
        for key, rows in row_counts.items():
            if rows % data_parallel:
                raise ConfigError(f"{key} = {rows} rows must be divisible by the data-parallel "
                                 f"mesh size data x fsdp = {data_parallel}")
        self.rules = parallel.resolve_rules(json.loads(config.rules) if config.rules else None)
        self.log(f"mesh {dict(self.mesh.shape)} on {jax.device_count()} "
                 f"{jax.default_backend()} device(s)")
        start = time.perf_counter()
        self.suite = build_suite(config, os.path.join(self.workdir, "data"))
        self.log(f"task suite {config.env.name!r}: {len(self.suite.train_tasks)} train / "
                 f"{len(self.suite.test_tasks)} test tasks, {len(self.suite.demonstrations)} "
                 f"demonstrations ({time.perf_counter() - start:.1f}s)")
        self.tokenizer, model, self.model_config = self._load_model()
        self.graphdef, params = nnx.split(model)
        self.log(f"policy: {self.model_config.arch}, "
                 f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M params, "
                 f"vocab {self.model_config.vocab_size}")
        self.initial_params = params
        self._check_lengths()
        # A fixed random subset, so every hop count is represented whatever the order.
        order = np.random.default_rng(0).permutation(len(self.suite.test_tasks))
        self.eval_tasks = [self.suite.test_tasks[i] for i in order[:config.eval.num_tasks]]
        r = config.rollout
        self.buckets = length_buckets(r.max_tokens)
        self.batch_rows = r.prompts_per_step * r.group_size
        self.engine, self._close_engine = build_engine(
            config, graphdef=self.graphdef, params=params, model_config=self.model_config,
            tokenizer=self.tokenizer, model_path=self.model_path, workdir=self.workdir,
            log=self.log)
        self._engine_params = None  # the params object the engine last received
        self.pool = RolloutPool(
            self.engine, self.suite.make_env, self.tokenizer,
            limits=EpisodeLimits(max_turns=config.env.max_turns,
                                 max_context_tokens=r.max_tokens),
            concurrency=r.concurrency, reward_fn=self.suite.reward_fn,
            episode_timeout_s=r.episode_timeout_s)
        self.batch_sharding = parallel.batch_sharding(self.mesh, self.rules)
        self.row_sharding = parallel.batch_sharding(self.mesh, self.rules, ("batch",))
        self.recorder = EpisodeRecorder(self.workdir, self.tokenizer,
                                        samples=config.log.samples, enabled=self.is_main)

    # ------------------------------------------------------------------ setup helpers

    def log(self, message: str) -> None:
        if self.is_main:
            tqdm.write(f"[agentjax] {message}")

    def _load_model(self):
        """(tokenizer, model, ModelConfig) from init_from, model.path, or built tiny.

        Params load as float32 (the master weights; exact for a bfloat16 checkpoint), the
        model computes in config.model.dtype. The memory plan is logged and checked
        before any weight is read.
        """
        config = self.config
        if config.init_from:
            path = os.path.join(config.init_from, HF_DIR)
            if not os.path.exists(path):
                path = config.init_from
        elif config.model.path:
            path = config.model.path
        else:
            path = os.path.join(self.workdir, "init_model")
            if not os.path.exists(os.path.join(path, "config.json")):
                self._build_tiny_model(path)
        precision = model_precision(config)
        with open(os.path.join(path, "config.json")) as f:
            plan = memory_plan(config, ModelConfig.from_hf(json.load(f), **precision),
                               self.mesh)
        self.log(f"memory plan per device (before activations):\n{plan.table()}")
        plan.check()
        model, model_config = load_hf(path, mesh=self.mesh, rules=self.rules, **precision)
        self.model_path = path
        template_kwargs = json.loads(config.tokenizer.template_kwargs or "{}")
        return load_tokenizer(path, template_kwargs=template_kwargs), model, model_config

    def _check_lengths(self) -> None:
        """Setup errors for token budgets a run could never meet: a context longer than
        the model's positions, a prompt that leaves no room to generate."""
        r, model = self.config.rollout, self.model_config
        if r.max_tokens > model.max_position_embeddings:
            raise ConfigError(
                f"config key 'rollout.max_tokens' is {r.max_tokens}, beyond the model's "
                f"max_position_embeddings={model.max_position_embeddings}; lower it")
        env, lengths = self.suite.make_env(), {}
        for task in list(self.suite.train_tasks) + list(self.suite.test_tasks):
            messages = env.reset(task)
            key = json.dumps(messages, sort_keys=True)
            if key not in lengths:
                lengths[key] = (len(prompt_ids(self.tokenizer, messages)), task.task_id)
        longest, task_id = max(lengths.values())
        if longest >= r.max_tokens:
            raise ConfigError(
                f"config key 'rollout.max_tokens' is {r.max_tokens} but the prompt of task "
                f"{task_id!r} alone has {longest} tokens: raise rollout.max_tokens (or "
                "shorten env.instruction)")
        if longest + r.max_new_tokens > r.max_tokens:
            self.log(f"warning: the longest prompt ({longest} tokens, task {task_id!r}) "
                     f"leaves less than rollout.max_new_tokens={r.max_new_tokens} of "
                     f"rollout.max_tokens={r.max_tokens} for the first action")

    def _build_tiny_model(self, path: str) -> None:
        """A random-init decoder sized by config.model with a tokenizer trained on the
        suite's texts, saved as an HF checkpoint (so every later stage loads HF)."""
        config, m = self.config, self.config.model
        tokenizer = build_tokenizer(self.suite.texts, vocab_size=config.tokenizer.vocab_size,
                                    special_tokens=AGENT_TAGS)
        head_dim = m.hidden_size // m.num_heads
        model_config = ModelConfig(
            arch=m.arch, vocab_size=len(tokenizer), hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size, num_layers=m.num_layers,
            num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=head_dim,
            tie_embeddings=True, qkv_bias=m.arch == "qwen2", qk_norm=m.arch == "qwen3",
            max_position_embeddings=max(config.rollout.max_tokens, 2048),
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id)
        save_hf(Decoder(model_config, rngs=nnx.Rngs(config.seed)), model_config, path,
                tokenizer=tokenizer)

    def sampling(self, step: int, seed_index: int | None = None) -> SamplingParams:
        """Rollout sampling at `step`: the temperature schedule's value there and a seed
        drawn from `seed_index` (default: step; a step's several draws pass their own),
        so the episodes of a resumed run are those of an uninterrupted one."""
        r = self.config.rollout
        index = step if seed_index is None else seed_index
        return SamplingParams(
            temperature=temperature_at(self.config, step), top_p=r.top_p, top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            seed=int(np.random.SeedSequence([self.config.seed, index]).generate_state(1)[0]
                     & 0x7FFFFFFF))

    def _batch_shardings(self, batch: dict) -> dict:
        """The rules' sharding of each batch array: [B, T] arrays and [B] rows."""
        return {k: self.batch_sharding if v.ndim == 2 else self.row_sharding
                for k, v in batch.items()}

    def device_batch(self, batch: dict) -> dict:
        """A numpy batch on the devices, sharded by the rules."""
        return jax.device_put(batch, self._batch_shardings(batch))

    def micro_batches(self, rows: int) -> int:
        """Micro-batches a minibatch of `rows` is split into (algo.microbatch_size)."""
        size = self.config.algo.microbatch_size
        return rows // size if size else 1

    def jit_update(self, update_fn, state):
        """(jitted update, state placed on its shardings). The update is jitted with
        explicit shardings — the state keeps its placement (`parallel.placed_shardings`,
        donated), the batch takes the rules' batch shardings, metrics come back
        replicated — compiled at the first call for that batch's keys."""
        state_shardings = parallel.placed_shardings(state, self.mesh)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        compiled = {}

        def update(state, batch):
            keys = tuple(sorted(batch))
            if keys not in compiled:
                compiled[keys] = jax.jit(
                    update_fn, in_shardings=(state_shardings, self._batch_shardings(batch)),
                    out_shardings=(state_shardings, replicated), donate_argnums=0)
            return compiled[keys](state, batch)

        return update, jax.device_put(state, state_shardings)

    def export(self, params, stage: str) -> None:
        """Saves `params` as an HF folder: <workdir>/<stage>/hf (<workdir>/hf for RL)."""
        path = os.path.join(self.workdir, stage, HF_DIR) if stage else \
            os.path.join(self.workdir, HF_DIR)
        # In the compute dtype, what inference runs: a bfloat16 model exports bfloat16
        # (as it was published), not its float32 training masters.
        save_hf(nnx.merge(self.graphdef, params), self.model_config, path,
                dtype=self.model_config.dtype, tokenizer=self.tokenizer)

    def restore_or_start(self, stage_dir: str, state, stage: str):
        """(state, host state, checkpointer, metrics writer) of a stage checkpointing
        into <stage_dir>/checkpoints and logging into <stage_dir>: the latest committed
        checkpoint's state and host state when there is one, else `state` and {}; the
        writer continues after the restored step."""
        config = self.config
        checkpointer = Checkpointer(os.path.join(stage_dir, CHECKPOINTS),
                                    every=config.checkpoint.every, keep=config.checkpoint.keep,
                                    async_save=config.checkpoint.async_save)
        restored = checkpointer.restore(state)
        host = {}
        if restored is not None:
            state, host = restored
            self.log(f"{stage}: resumed at step {host['step']}")
        writer = MetricsWriter(stage_dir, tensorboard=config.log.tensorboard,
                               resume_step=host.get("step", 0), enabled=self.is_main)
        return state, host, checkpointer, writer

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, params, prefix: str, tasks=None, *,
                 version: int | None = None) -> dict[str, float]:
        """Greedy and sampled success of `params` (also pass@k, per hops) on `tasks`
        (default: the fixed held-out evaluation subset); the engine holds `params` as
        weight `version` afterwards (None: its next, unless it holds `params` already)."""
        self.sync_weights(params, version)
        tasks = self.eval_tasks if tasks is None else tasks
        sampling = dataclasses.replace(self.sampling(0),
                                       temperature=self.config.rollout.temperature,
                                       seed=self.config.seed + 10_000)
        def inspect(episodes):
            for message in self.recorder.record(0, prefix, episodes):
                self.log(f"{prefix} evaluation: new episode error: {message}")
            warning = check_failures(episodes, where=f"{prefix} evaluation", fatal=True)
            if warning:
                self.log(f"warning: {warning}")

        return evaluate(self.pool, tasks, success_key=self.suite.success_key,
                        sampling=sampling, samples=self.config.eval.samples, prefix=prefix,
                        inspect=inspect)

    # ------------------------------------------------------------------ RL

    def restore_params(self, step: int | None = None):
        """Policy params of RL checkpoint `step` (default: the latest) of this workdir."""
        state = rl_loop.init_rl_state(self, self.initial_params)[0]
        checkpointer = Checkpointer(os.path.join(self.workdir, CHECKPOINTS), every=0,
                                    read_only=True)
        restored = checkpointer.restore(state, step)
        if restored is None:
            raise FileNotFoundError(f"no RL checkpoint in {self.workdir}/{CHECKPOINTS}")
        return restored[0].params

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Pretraining and SFT (if configured), RL, RFT or DPO (config.stage; none for
        "sft"), then the final report."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> dict[str, Any]:
        config = self.config
        params = self.initial_params
        results: dict[str, Any] = {f"demonstrator/{k}": v["success"]
                                   for k, v in self.suite.baselines.items()}
        for name, baseline in self.suite.baselines.items():
            results.update({f"demonstrator/{name}/hops={h}": v
                            for h, v in baseline["by_hops"].items()})
        if (config.pretrain.steps or config.sft.steps) and not config.init_from:
            # sft/eval.json is written (atomically) once SFT has finished, and RL
            # checkpoints only after it: with both, RL restores its whole state (the
            # initial params give it shapes only). Otherwise run_sft resumes from (or,
            # when done, only restores) its committed checkpoints, so RL starts from
            # the SFT params whatever point a kill hit.
            sft_file = os.path.join(self.workdir, "sft", "eval.json")
            sft_results = None
            if os.path.exists(sft_file):
                with open(sft_file) as f:
                    sft_results = json.load(f)
            rl_resumes = config.stage != "sft" and latest_committed_step(
                os.path.join(self.workdir, CHECKPOINTS)) is not None
            if sft_results is None or not rl_resumes:
                params = sft.run_sft(self, params)
            if sft_results is None:
                sft_results = self.evaluate(params, "sft")
                if self.is_main:
                    atomic.write_json(sft_file, sft_results)
            results.update(sft_results)
        if config.stage != "sft":
            run_stage = rl_loop.run_rl if config.stage == "rl" else offline.run_offline
            _, last_eval = run_stage(self, params)
            results.update(last_eval)
        results["time/total_s"] = time.perf_counter() - self.started
        if self.is_main:
            atomic.write_json(os.path.join(self.workdir, "final.json"), results)
            print(report_table(results, agent="RL agent" if config.stage in ("rl", "sft")
                               else f"{config.stage.upper()} agent"))
        return results

    def sync_weights(self, params, version: int | None = None) -> None:
        """Sends `params` to the rollout engine unless it has them already (evaluation
        after an RL step: a second export and reload for an SGLang pool); `version` is
        what completions will report (default: the engine's previous + 1)."""
        if params is not self._engine_params:
            self.engine.update_weights(params, version=version)
            self._engine_params = params

    def close(self):
        self.pool.close()
        self._close_engine()


def report_table(results: dict[str, float], agent: str = "RL agent") -> str:
    """Markdown table of held-out success: demonstrator, SFT agent, the agent of the
    stage after SFT (row `agent`); a column per task group (hops, taught: see
    train.evaluate)."""
    rows = []
    groups = sorted({group_of(k) for k in results} - {None})

    def cells(prefix):
        return [f"{results[key]:.3f}" if key in results else "-"
                for key in [prefix] + [f"{prefix}/{g}" for g in groups]]

    rows.append(["demonstrator (scripted)", "-"] + cells("demonstrator/demonstrator"))
    for name, prefix in (("SFT agent", "sft"), (agent, "eval")):
        greedy = results.get(f"{prefix}/success_greedy")
        rows.append([name, "-" if greedy is None else f"{greedy:.3f}"]
                    + cells(f"{prefix}/success_sampled"))
    header = ["policy", "greedy", "sampled"] + [f"sampled, {g}" for g in groups]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
