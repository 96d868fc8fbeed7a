"""The trainer: SFT warm-start, then RL, with evaluation, checkpoints and metrics.

    results = Trainer(config, workdir).run()

Sections, in the order a run meets them:
  1. setup      validate config, mesh, task suite, tokenizer + model, engine + pool
  2. SFT        next-token loss on a text corpus (config.pretrain.steps > 0), then
                masked next-token loss on demonstrations (config.sft.steps > 0), corpus
                documents mixed in (config.sft.corpus_mix): train/sft.py
  3. RL         sample tasks -> roll out groups -> prepare (log-probs, advantages)
                -> jitted update -> sync weights to the engine (`run_rl`'s rl_step),
                then the hooks due (train/hooks.py): evaluate / log / checkpoint
  4. report     held-out success of the demonstrator, the SFT agent and the RL agent

Resume: every stage checkpoints into the workdir (orbax: device state; json: sampler
and step); rerunning with the same `--workdir` continues where the run stopped, with
the same data order and random streams. What a rerun reads back is written atomically
(agentjax.atomic; orbax commits checkpoints by renaming), and which stage is done is
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
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from agentjax import atomic, parallel
from agentjax.data.curriculum import make_sampler
from agentjax.models import Decoder, ModelConfig, ValueModel, load_hf, save_hf
from agentjax.models.tokenizer import AGENT_TAGS, build_tokenizer, load_tokenizer, prompt_ids
from agentjax.rollout.agent_loop import EpisodeLimits
from agentjax.rollout.engine import SamplingParams
from agentjax.rollout.lanes import LanedEngine
from agentjax.rollout.pool import RolloutPool
from agentjax.rl.shaping import dynamic_sampling_keep, overlong_penalty
from agentjax.rollout.trajectory import Trajectory, collate
from agentjax.train import diagnostics, sft, step as step_lib
from agentjax.train.checkpoint import Checkpointer, latest_committed_step
from agentjax.train.config import ConfigError, validate
from agentjax.train.episodes import EpisodeRecorder, check_failures
from agentjax.train.evaluate import evaluate, group_of, solved
from agentjax.train.hooks import Hook, run_hooks
from agentjax.train.memory import memory_plan
from agentjax.train.metrics import MetricsWriter
from agentjax.train.prepare import build_prepare, critic_value_fn, model_logprob_fn
from agentjax.train.precision import master_copy, model_precision
from agentjax.train.preflight import check_runtime
from agentjax.train.suites import build_suite

class TrainingDiverged(RuntimeError):
    """Optimizer updates stayed non-finite for optim.max_nonfinite_steps steps."""


HF_DIR = "hf"  # every stage exports its final policy here (init_from / SGLang / eval)
CHECKPOINTS = "checkpoints"  # in the workdir (RL) or in <workdir>/<stage> (pretrain, sft)


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def length_buckets(max_tokens: int, count: int = 4, multiple: int = 32) -> tuple[int, ...]:
    """`count` collate lengths up to max_tokens, so jit sees at most `count` shapes."""
    sizes = {max(multiple, -(-max_tokens * (i + 1) // count // multiple) * multiple)
             for i in range(count)}
    return tuple(sorted(min(s, max_tokens) for s in sizes))


def optimizer_updates(config) -> int:
    """Optimizer updates an RL run makes (the lr schedule's horizon): each of its
    total_steps runs ppo_epochs x minibatches of them."""
    return config.total_steps * config.algo.ppo_epochs * config.algo.minibatches


def episode_action_budget(config) -> int:
    """The most action tokens one episode can generate: max_new_tokens per turn for
    env.max_turns turns, within the context of rollout.max_tokens."""
    r = config.rollout
    return min(config.env.max_turns * r.max_new_tokens, r.max_tokens)


def temperature_at(config, step: int) -> float:
    """Linear rollout-temperature schedule from rollout.temperature to final_temperature."""
    fraction = step / max(config.total_steps - 1, 1)
    r = config.rollout
    return float(r.temperature + fraction * (r.final_temperature - r.temperature))


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
        # Each lane keeps its own copy in the compute dtype (JaxEngine copies and casts), so
        # update steps may donate (free) the trainer's buffers.
        self.engine = LanedEngine.build(
            self.graphdef, params, lanes=r.engine_lanes, tokenizer=self.tokenizer,
            max_slots=r.engine_slots, max_len=r.max_tokens,
            decode_steps=r.decode_steps, deterministic=r.deterministic, seed=config.seed)
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

    def sampling(self, step: int) -> SamplingParams:
        """Rollout sampling at `step` (temperature schedule; a seed per step, so the
        episodes of a resumed run are those of an uninterrupted one)."""
        r = self.config.rollout
        return SamplingParams(
            temperature=temperature_at(self.config, step), top_p=r.top_p, top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            seed=int(np.random.SeedSequence([self.config.seed, step]).generate_state(1)[0]
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

    def evaluate(self, params, prefix: str, tasks=None) -> dict[str, float]:
        """Greedy and sampled success of `params` (also pass@k, per hops) on `tasks`
        (default: the fixed held-out evaluation subset)."""
        self.engine.update_weights(params)
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

    def _init_rl_state(self, params):
        config, algo = self.config, self.config.algo
        optimizer = step_lib.make_optimizer(
            config.optim.lr, total_steps=optimizer_updates(config),
            warmup_steps=config.optim.warmup_steps, schedule=config.optim.schedule,
            weight_decay=config.optim.weight_decay, b1=config.optim.b1, b2=config.optim.b2,
            grad_clip=config.optim.grad_clip)
        critic_graphdef = critic_optimizer = critic_params = critic_opt_state = None
        params = master_copy(params)
        if algo.advantage == "gae":
            critic = ValueModel(nnx.merge(self.graphdef, _copy(params)))
            critic_graphdef, critic_params = nnx.split(critic)
            critic_optimizer = optax.chain(optax.clip_by_global_norm(config.optim.grad_clip),
                                           optax.adamw(algo.critic_lr))
            critic_opt_state = critic_optimizer.init(critic_params)
        state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                    opt_state=optimizer.init(params),
                                    rng=jax.random.key(config.seed),
                                    critic_params=critic_params,
                                    critic_opt_state=critic_opt_state,
                                    ref_params=_copy(params) if algo.kl_coef > 0 else None)
        return state, optimizer, critic_graphdef, critic_optimizer

    def _shape_overlong(self, trajectories: list[Trajectory]) -> None:
        """DAPO overlong shaping: penalize episodes whose action tokens enter the last
        `overlong_buffer` tokens before `overlong_max_len` (added to the final reward)."""
        algo = self.config.algo
        lengths = np.array([t.num_action_tokens for t in trajectories], np.float32)
        penalties = np.asarray(overlong_penalty(
            lengths, max_len=algo.overlong_max_len, buffer=algo.overlong_buffer,
            factor=algo.overlong_factor))
        for traj, penalty in zip(trajectories, penalties):
            traj.final_reward += float(penalty)
            traj.metadata.setdefault("reward_components", {})["overlong"] = float(penalty)

    def _rollout(self, sampler, step: int):
        """One step's groups. With dynamic sampling (DAPO), groups whose rewards are all
        equal are set aside and more tasks drawn until the batch is full; if the rounds
        run out, set-aside groups (zero advantage: no policy-gradient signal) fill the
        batch."""
        config, r = self.config, self.config.rollout
        kept, set_aside, rounds = [], [], 0
        while len(kept) < r.prompts_per_step:
            drawn = sampler.sample(r.prompts_per_step - len(kept))
            collected = self.pool.collect_sync(
                drawn, r.group_size, sampling=self.sampling(step * 100 + rounds),
                first_group_id=0)
            if config.algo.overlong_buffer:
                self._shape_overlong([t for group in collected for t in group])
            sampler.update(drawn, [np.mean([solved(t, self.suite.success_key) for t in g])
                                   for g in collected])
            if config.algo.dynamic_sampling:
                rewards = np.array([t.total_reward for g in collected for t in g], np.float32)
                keep = np.asarray(dynamic_sampling_keep(
                    rewards, np.repeat(np.arange(len(collected)), r.group_size),
                    len(collected)))[::r.group_size]
            else:
                keep = [True] * len(collected)
            for group, varied in zip(collected, keep):
                (kept if varied else set_aside).append(group)
            rounds += 1
            if rounds > config.algo.max_resample_rounds:
                break
        groups = (kept + set_aside)[:r.prompts_per_step]
        return groups, {"rollout/rounds": rounds, "rollout/kept_groups": len(kept)}

    def _rl_checkpointer(self, **options) -> Checkpointer:
        return Checkpointer(os.path.join(self.workdir, CHECKPOINTS), **options)

    def _guard_nonfinite(self, state, metrics, step: int, bad_steps: int, checkpointer,
                         host: dict):
        """Reacts to optimizer updates the jitted update refused (non-finite loss,
        gradient or params; `step_lib.epoch_minibatch_steps`): warns, rolls the policy
        back to the last checkpoint when optim.on_nonfinite='rollback', and after
        optim.max_nonfinite_steps consecutive such steps saves a checkpoint and stops.
        Returns (state, consecutive bad steps)."""
        optim = self.config.optim
        refused = metrics.get("nonfinite_updates", 0.0) + metrics.get(
            "critic/nonfinite_updates", 0.0)
        if not refused:
            return state, 0
        bad_steps += 1
        where = (f"RL step {step}: {metrics.get('nonfinite_updates', 0.0):.0%} of the policy's "
                 f"optimizer updates had a non-finite loss, gradient or result (loss "
                 f"{metrics.get('loss')}, grad_norm {metrics.get('grad_norm')}) and were "
                 "not applied")
        if bad_steps >= optim.max_nonfinite_steps:
            checkpointer.save(step, state, host, force=True)
            checkpointer.wait()
            raise TrainingDiverged(
                f"{where}; {bad_steps} consecutive steps like it (optim.max_nonfinite_steps="
                f"{optim.max_nonfinite_steps}): stopping. The last finite state is saved at "
                f"step {step}; lower optim.lr, check the rewards (reward/* metrics) or set "
                "optim.on_nonfinite='rollback'")
        if optim.on_nonfinite == "rollback" and checkpointer.latest_step is not None:
            checkpointer.wait()
            restored, _ = checkpointer.restore(state)
            self.log(f"warning: {where}; rolled the policy back to checkpoint "
                     f"{checkpointer.latest_step}")
            return restored, bad_steps
        self.log(f"warning: {where}; skipped")
        return state, bad_steps

    def restore_params(self, step: int | None = None):
        """Policy params of RL checkpoint `step` (default: the latest) of this workdir."""
        state = self._init_rl_state(self.initial_params)[0]
        checkpointer = self._rl_checkpointer(every=0, read_only=True)
        restored = checkpointer.restore(state, step)
        if restored is None:
            raise FileNotFoundError(f"no RL checkpoint in {self.workdir}/{CHECKPOINTS}")
        return restored[0].params

    def _build_rl_update(self, params):
        """(initial state, update(state, batch), prepare(params, ref, critic, batch)) of
        the configured algorithm, jitted."""
        config, algo = self.config, self.config.algo
        state, optimizer, critic_graphdef, critic_optimizer = self._init_rl_state(params)
        policy_loss = step_lib.rl_loss(self.graphdef, algo, chunk_size=config.model.logprob_chunk)
        critic_loss = (step_lib.value_loss_fn(critic_graphdef, algo) if critic_graphdef
                       else None)
        update, state = self.jit_update(step_lib.build_update(
            policy_loss, optimizer, epochs=algo.ppo_epochs, minibatches=algo.minibatches,
            micro_batches=self.micro_batches(self.batch_rows // algo.minibatches),
            norm_constant=algo.agg_constant or None, critic_loss_fn=critic_loss,
            critic_optimizer=critic_optimizer, critic_warmup_steps=algo.critic_warmup_steps),
            state)
        prepare = jax.jit(build_prepare(
            model_logprob_fn(self.graphdef, chunk_size=config.model.logprob_chunk), algo,
            num_groups=config.rollout.prompts_per_step,
            mask_observations=config.env.mask_observations,
            value_fn=critic_value_fn(critic_graphdef) if critic_graphdef else None))
        return state, update, prepare

    def run_rl(self, params):
        """RL from `params` for total_steps; returns (final params, last eval metrics).

        Each step rolls out groups (`_rollout`), updates the policy on them (`rl_step`),
        then runs the hooks due: evaluation, logging with warnings, checkpoint.
        """
        config = self.config
        state, update, prepare = self._build_rl_update(params)
        sampler = make_sampler(config.data.curriculum, self.suite.train_tasks,
                               seed=config.seed)
        state, host, checkpointer, writer = self.restore_or_start(self.workdir, state, "RL")
        start, last_eval = host.get("step", 0), host.get("last_eval", {})
        if host:
            sampler.load_state_dict(host["sampler"])
        self.engine.update_weights(state.params)
        bar = tqdm(range(start, config.total_steps), desc=config.algo.name,
                   disable=not (self.is_main and config.log.progress))
        bad_steps = 0

        def host_state(done: int) -> dict:
            """What a resumed run needs after `done` steps, beyond the device state."""
            return {"step": done, "sampler": sampler.state_dict(), "last_eval": last_eval}

        def rl_step(state, groups, step: int):
            """The update on one step's groups; the engine then samples with its result."""
            nonlocal bad_steps
            trajectories = [t for group in groups for t in group]
            batch = collate(trajectories, buckets=self.buckets,
                            pad_id=self.tokenizer.pad_token_id, batch_size=self.batch_rows)
            metrics = diagnostics.rollout_metrics(groups, batch)
            batch["temperature"] = np.full((self.batch_rows,), temperature_at(config, step),
                                           np.float32)
            del batch["truncated"]
            device_batch, prep_metrics = prepare(state.params, state.ref_params,
                                                 state.critic_params, self.device_batch(batch))
            state, update_metrics = update(state, device_batch)
            jax.block_until_ready(state.params)
            metrics.update(jax.device_get(prep_metrics))
            metrics.update(jax.device_get(update_metrics))
            state, bad_steps = self._guard_nonfinite(state, metrics, step + 1, bad_steps,
                                                     checkpointer, host_state(step + 1))
            self.engine.update_weights(state.params)
            return state, metrics

        def evaluate_now(step, state, metrics):
            nonlocal last_eval
            last_eval = self.evaluate(state.params, "eval")
            metrics.update(last_eval)

        def log(step, state, metrics):
            row = writer.write(step, metrics)
            bar.set_postfix(reward=f"{row['reward/mean']:.2f}",
                            success=f"{row['success/train']:.2f}",
                            ent=f"{row.get('entropy', 0):.2f}")
            for warning in diagnostics.failure_warnings(
                    row, max_action_tokens=episode_action_budget(config)):
                self.log(f"step {step}: warning: {warning}")

        def save(step, state, metrics):
            checkpointer.save(step, state, host_state(step), force=True)

        hooks = [Hook(config.eval.every, evaluate_now), Hook(config.log.every, log),
                 Hook(config.checkpoint.every, save)]
        for step in bar:
            t0 = time.perf_counter()
            groups, rollout_info = self._rollout(sampler, step)
            for group_index, group in enumerate(groups):
                for traj in group:
                    traj.group_id = group_index
            t1 = time.perf_counter()
            self._inspect_episodes(groups, step + 1, first=step == start)
            state, metrics = rl_step(state, groups, step)
            t2 = time.perf_counter()
            tokens = sum(t.num_action_tokens for group in groups for t in group)
            metrics.update({"time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
                            "time/step_s": t2 - t0, "rollout/tokens_per_s": tokens / (t1 - t0),
                            **rollout_info,
                            "rollout/temperature": temperature_at(config, step),
                            "success/train": np.mean([solved(t, self.suite.success_key)
                                                      for group in groups for t in group])})
            run_hooks(hooks, step + 1, config.total_steps, state, metrics)
        checkpointer.wait()
        writer.close()
        self.export(state.params, "")
        return state.params, last_eval

    def _inspect_episodes(self, groups, step: int, first: bool) -> None:
        """Records the episodes' errors and samples; warns when many failed (stops when
        all of the first step's did: `check_failures`)."""
        episodes = [t for group in groups for t in group]
        for message in self.recorder.record(step, "rl", episodes):
            self.log(f"step {step}: new episode error: {message}")
        warning = check_failures(episodes, where=f"RL step {step}", fatal=first)
        if warning:
            self.log(f"step {step}: warning: {warning}")

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Pretraining and SFT (if configured), RL (unless stage == "sft"), then the
        final report."""
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
            rl_resumes = config.stage == "rl" and latest_committed_step(
                os.path.join(self.workdir, CHECKPOINTS)) is not None
            if sft_results is None or not rl_resumes:
                params = sft.run_sft(self, params)
            if sft_results is None:
                sft_results = self.evaluate(params, "sft")
                if self.is_main:
                    atomic.write_json(sft_file, sft_results)
            results.update(sft_results)
        if config.stage == "rl":
            _, last_eval = self.run_rl(params)
            results.update(last_eval)
        results["time/total_s"] = time.perf_counter() - self.started
        if self.is_main:
            atomic.write_json(os.path.join(self.workdir, "final.json"), results)
            print(report_table(results))
        return results

    def close(self):
        self.pool.close()
        self.engine.close()


def report_table(results: dict[str, float]) -> str:
    """Markdown table of held-out success: demonstrator, SFT agent, RL agent; a column
    per task group (hops, taught: see train.evaluate)."""
    rows = []
    groups = sorted({group_of(k) for k in results} - {None})

    def cells(prefix):
        return [f"{results[key]:.3f}" if key in results else "-"
                for key in [prefix] + [f"{prefix}/{g}" for g in groups]]

    rows.append(["demonstrator (scripted)", "-"] + cells("demonstrator/demonstrator"))
    for name, prefix in (("SFT agent", "sft"), ("RL agent", "eval")):
        greedy = results.get(f"{prefix}/success_greedy")
        rows.append([name, "-" if greedy is None else f"{greedy:.3f}"]
                    + cells(f"{prefix}/success_sampled"))
    header = ["policy", "greedy", "sampled"] + [f"sampled, {g}" for g in groups]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
