"""The RL stage: each step takes groups from the rollout source, updates the policy on
them, hands the new weights to the engine, then runs the hooks due (evaluation, logging
with warnings, checkpoint).

    params, last_eval = run_rl(config, runtime, policy, rollouts, params)

`RLStage` holds the loop's state (the source, the sampler, the last evaluation) and its
steps; train/fit.py runs them. The source sees the run only through the `RolloutPort`
the stage builds at `resume` (the pool, the training tasks, `Rollouts.sampling`, weight
sync and its undonated copy, the log and the groups log). One step:
    groups = source.next_groups(step)                 P groups of G episodes: sync
                                                      (agents/groups.collect_groups:
                                                      hindsight, DAPO's dynamic sampling
                                                      and overlong shaping) or async, a
                                                      producer running ahead
                                                      (agents/sources.py)
    batch = collate(groups)                           core/trajectory.py (+ the turns'
                                                      anchor states, core/anchors.py,
                                                      for a turn-level advantage)
    batch = prepare(params, ref, critic, batch)       log-probs, KL, advantages
    state, metrics = update(state, batch)             train/update.py: epochs x minibatches
                                                      x micro-batches (rows, or episodes
                                                      packed to algo.micro_tokens)
    source.push_weights(state.params, step + 2)       the engine samples with the update
    hooks: eval / log / checkpoint

A rerun in the same workdir resumes at the last committed step with the same sampler
state and sampling seeds (`Rollouts.sampling`).
"""
from __future__ import annotations

import functools
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from agentjax.agents.evaluation import solved
from agentjax.agents.groups import GroupRules, Hindsight, Overlong
from agentjax.agents.sources import GROUPS_LOG, RolloutPlan, RolloutPort, make_source
from agentjax.core.anchors import anchor_ids
from agentjax.core.task import Task
from agentjax.core.trajectory import collate, mask_rollouts, truncated_rollouts
from agentjax.data.curriculum import make_sampler
from agentjax.models import ValueModel
from agentjax.models.lora import base_graphdef, has_adapters, split_adapters
from agentjax.models.tokenizer import prompt_ids
from agentjax.rl import objectives
from agentjax.rl.advantages import needs_critic, needs_turns
from agentjax.rl.prepare import build_prepare, critic_value_fn, model_logprob_fn
from agentjax.train import diagnostics, update as step_lib
from agentjax.train.fit import Hook, Stage, fit, micro_batches
from agentjax.train.metrics import StepLog
from agentjax.train.policy import HF_DIR, Policy
from agentjax.train.precision import master_copy
from agentjax.train.rollouts import Rollouts, temperature_at, undonated_copy
from agentjax.train.runtime import Runtime
from agentjax.train.teacher import Teacher, load_teacher


def length_buckets(max_tokens: int, count: int = 4, multiple: int = 32) -> tuple[int, ...]:
    """`count` collate lengths up to max_tokens, so jit sees at most `count` shapes."""
    sizes = {max(multiple, -(-max_tokens * (i + 1) // count // multiple) * multiple)
             for i in range(count)}
    return tuple(sorted(min(s, max_tokens) for s in sizes))


def batch_rows(config) -> int:
    """Rows of an RL batch: a row per rollout segment, up to rollout.max_segments each."""
    r = config.rollout
    return r.prompts_per_step * r.group_size * r.max_segments


def optimizer_updates(config) -> int:
    """Optimizer updates an RL run makes (the lr schedule's horizon): each of its
    total_steps runs ppo_epochs x minibatches of them."""
    return config.total_steps * config.algo.ppo_epochs * config.algo.minibatches


def episode_action_budget(config) -> int:
    """The most action tokens one episode can generate: max_new_tokens per turn for
    env.max_turns turns, within the context of rollout.max_tokens (with context
    compaction, env.max_compactions summaries more, each segment its own context)."""
    r, env = config.rollout, config.env
    if env.compact_at_tokens:
        summaries = env.max_compactions if env.compaction == "summary" else 0
        return (env.max_turns + summaries) * r.max_new_tokens
    return min(env.max_turns * r.max_new_tokens, r.max_tokens)


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def init_rl_state(config: ml_collections.ConfigDict, graphdef: nnx.GraphDef, params):
    """(TrainState, optimizer, critic graphdef, critic optimizer) of an RL run from
    `params`: float32 masters, a critic initialized from the policy (GAE only), a frozen
    reference copy (KL, or the DPO stage's reference).

    With LoRA the optimizer state is the adapters', there is no reference copy (it is
    the base with the adapters off: `reference_logprob_fn`), and the critic is a value
    head plus adapters of its own (copies of the policy's) over the policy's frozen
    base, not a second trunk: a 7B critic costs its adapters, head and their Adam
    moments, and its values still adapt their features."""
    algo = config.algo
    optimizer = step_lib.make_optimizer(
        config.optim.lr, total_steps=optimizer_updates(config),
        warmup_steps=config.optim.warmup_steps, schedule=config.optim.schedule,
        weight_decay=config.optim.weight_decay, b1=config.optim.b1, b2=config.optim.b2,
        grad_clip=config.optim.grad_clip)
    critic_graphdef = critic_optimizer = critic_params = critic_opt_state = None
    params = master_copy(params)
    lora = has_adapters(params)
    if needs_critic(algo.advantage):
        # With LoRA the trunk's base is the policy's own arrays (critic_join), the rest
        # fresh copies: the state must not hold one buffer twice (it is donated).
        critic_graphdef, critic_params = nnx.split(ValueModel(nnx.merge(
            graphdef, params if lora else _copy(params))))
        if lora:
            critic_params = _copy(step_lib.critic_split(critic_params))
        critic_optimizer = optax.chain(optax.clip_by_global_norm(config.optim.grad_clip),
                                       optax.adamw(algo.critic_lr))
        critic_opt_state = critic_optimizer.init(critic_params)
    needs_reference = (algo.kl_coef > 0 or config.stage == "dpo") and not lora
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=step_lib.init_opt_state(optimizer, params),
                                rng=jax.random.key(config.seed),
                                critic_params=critic_params,
                                critic_opt_state=critic_opt_state,
                                ref_params=_copy(params) if needs_reference else None)
    return state, optimizer, critic_graphdef, critic_optimizer


def build_rl_update(config: ml_collections.ConfigDict, runtime: Runtime, graphdef: nnx.GraphDef,
                    params, teacher: Teacher | None = None):
    """(initial state, update(state, batch), prepare(params, ref, critic, batch)) of the
    configured algorithm, jitted; with on-policy distillation's `teacher`
    (train/teacher.py) `prepare` holds its params."""
    algo = config.algo
    state, optimizer, critic_graphdef, critic_optimizer = init_rl_state(config, graphdef, params)
    rows = batch_rows(config)
    policy_loss = objectives.rl_loss(graphdef, algo, chunk_size=config.model.logprob_chunk,
                                     positions_frac=config.model.logprob_positions)
    critic_loss = (objectives.value_loss_fn(critic_graphdef, algo) if critic_graphdef
                   else None)
    update, state = runtime.jit_update(step_lib.build_update(
        policy_loss, optimizer, epochs=algo.ppo_epochs, minibatches=algo.minibatches,
        micro_batches=micro_batches(rows // algo.minibatches, algo.microbatch_size),
        micro_tokens=algo.micro_tokens, norm_constant=algo.agg_constant or None,
        critic_loss_fn=critic_loss, critic_optimizer=critic_optimizer,
        critic_warmup_steps=algo.critic_warmup_steps),
        state)
    prepare = jax.jit(build_prepare(
        model_logprob_fn(graphdef, chunk_size=config.model.logprob_chunk), algo,
        num_groups=config.rollout.prompts_per_step,
        loss_on_observations=config.env.loss_on_observations,
        value_fn=critic_value_fn(critic_graphdef) if critic_graphdef else None,
        offpolicy_metrics=config.rollout.mode == "async",
        ref_logprob_fn=reference_logprob_fn(graphdef, params,
                                            chunk_size=config.model.logprob_chunk),
        teacher_logprob_fn=model_logprob_fn(teacher.graphdef,
                                            chunk_size=config.model.logprob_chunk)
        if teacher else None))
    if teacher is not None:
        prepare = functools.partial(prepare, teacher_params=teacher.params)
    return state, update, prepare


def reference_logprob_fn(graphdef: nnx.GraphDef, params, *, chunk_size: int):
    """The KL reference's LogprobFn: the model's at the reference params, or with LoRA
    the base model's at the policy's params, the adapters left out (`prepare_inputs`
    passes the policy's params as the reference's: no copy)."""
    if not has_adapters(params):
        return model_logprob_fn(graphdef, chunk_size=chunk_size)
    base = model_logprob_fn(base_graphdef(nnx.merge(graphdef, params)), chunk_size=chunk_size)
    return lambda params, batch, temperature: base(split_adapters(params)[1], batch,
                                                   temperature)


def prepare_inputs(state: step_lib.TrainState) -> tuple:
    """(params, reference params, critic params) `prepare` reads from the state: with
    LoRA the reference is the policy's params (its base) and the critic's params join
    its trainable part with the policy's base (`update.critic_join`)."""
    _, base = state.split_frozen()
    if base is None:
        return state.params, state.ref_params, state.critic_params
    critic = (None if state.critic_params is None
              else step_lib.critic_join(state.critic_params, base))
    return state.params, state.params, critic


def group_rules(config: ml_collections.ConfigDict, suite, tokenizer,
                log: Callable[[str], None]) -> GroupRules:
    """The configured group post-processing (agents/groups.py): hindsight relabeling
    (data.hindsight), DAPO's overlong shaping and dynamic sampling (algo.*)."""
    algo, hindsight = config.algo, None
    if config.data.hindsight:
        def prompt_of(task: Task) -> list[int]:
            return prompt_ids(tokenizer, suite.make_env().reset(task))

        hindsight = Hindsight(suite.relabel, suite.reward_fn, prompt_of,
                              success_key=suite.success_key,
                              max_tokens=config.rollout.max_tokens)
    overlong = (Overlong(algo.overlong_max_len, algo.overlong_buffer, algo.overlong_factor)
                if algo.overlong_buffer else None)
    return GroupRules(suite.success_key, hindsight, overlong, algo.dynamic_sampling,
                      algo.max_resample_rounds, log)


def rollout_plan(config: ml_collections.ConfigDict) -> RolloutPlan:
    """The rollout source's group counts and async bounds (rollout.*, total_steps)."""
    r = config.rollout
    return RolloutPlan(prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                       total_steps=config.total_steps, max_staleness=r.max_staleness,
                       partial_rollouts=r.partial_rollouts, concurrency=r.concurrency,
                       queue_groups=r.queue_groups)


def run_rl(config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
           rollouts: Rollouts, params):
    """RL from `params` for total_steps (resuming from the workdir's last committed
    checkpoint); exports to <workdir>/hf and returns (final params, last eval metrics)."""
    teacher = (load_teacher(config, runtime, tokenizer=policy.tokenizer,
                            vocab_size=policy.model_config.vocab_size)
               if config.algo.distill_coef else None)
    state, update, prepare = build_rl_update(config, runtime, policy.graphdef, params,
                                             teacher)
    stage = RLStage(config, runtime, policy, rollouts, update=update, prepare=prepare)
    state = fit(runtime, stage, state, checkpoint_every=config.checkpoint.every)
    policy.export(state.params, os.path.join(runtime.workdir, HF_DIR))
    return state.params, stage.last_eval


class RLStage(Stage):
    """The RL loop's steps (module docstring) over the jitted `update` and `prepare`
    (`build_rl_update`).

    Attributes:
      sampler: the task source (data.curriculum), checkpointed with the source's state.
      rules: the group post-processing (`group_rules`).
      source: where the groups come from (agents/sources.py), built by `resume`.
      start: the step the loop started (or resumed) at.
      last_eval: the last evaluation's metrics.
    """

    name = "RL"

    def __init__(self, config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
                 rollouts: Rollouts, *, update, prepare):
        self.config, self.runtime, self.policy, self.rollouts = config, runtime, policy, rollouts
        self.update, self.prepare = update, prepare
        self.desc, self.folder, self.steps = config.algo.name, runtime.workdir, config.total_steps
        self.log_every, self.optim = config.log.every, config.optim
        self.hooks = [Hook(config.eval.every, self.evaluate)]
        r = config.rollout
        self.rows, self.buckets = batch_rows(config), length_buckets(r.max_tokens)
        self.sampler = make_sampler(config.data.curriculum, rollouts.suite.train_tasks,
                                    seed=config.seed)
        self.rules = group_rules(config, rollouts.suite, policy.tokenizer, runtime.log)
        self.source, self.start, self.last_eval = None, 0, {}

    def resume(self, state, host: dict) -> None:
        """Builds the rollout source at the restored step, the engine holding the
        restored weights and the sampler its restored state."""
        self.start, self.last_eval = host.get("step", 0), host.get("last_eval", {})
        record = StepLog(os.path.join(self.runtime.workdir, GROUPS_LOG),
                         resume_step=self.start, enabled=self.runtime.is_main)
        rollouts = self.rollouts
        port = RolloutPort(pool=rollouts.pool, tasks=rollouts.suite.train_tasks,
                           sampling=rollouts.sampling, push_weights=rollouts.sync_weights,
                           copy_weights=undonated_copy, log=rollouts.log,
                           record=record.append)
        self.source = make_source(self.config.rollout.mode, port, rollout_plan(self.config),
                                  self.sampler, state.params, rules=self.rules,
                                  start=self.start, host=host)

    def host_state(self, done: int) -> dict:
        return {"step": done, **self.source.state_dict(), "last_eval": self.last_eval}

    def draw(self, state, step: int):
        t0 = time.perf_counter()
        groups, info = self.source.next_groups(step)
        t1 = time.perf_counter()
        self.rollouts.inspect([t for group in groups for t in group], step + 1, stage="rl",
                              where=f"RL step {step + 1}", fatal=step == self.start,
                              label=f"step {step + 1}")
        return groups, info, t0, t1

    def train(self, state, data, step: int):
        groups, rows = data[0], self.rows
        batch = collate([t for group in groups for t in group], buckets=self.buckets,
                        pad_id=self.policy.tokenizer.pad_token_id, batch_size=rows,
                        max_segments=self.config.rollout.max_segments)
        if needs_turns(self.config.algo.advantage):
            batch["anchor_ids"] = anchor_ids([t for group in groups for t in group],
                                             batch["targets"].shape,
                                             key=self.config.algo.turn_anchor)
        metrics = diagnostics.rollout_metrics(groups, batch)
        if self.config.algo.truncated_rollouts == "mask":
            episodes = [t for group in groups for t in group]
            metrics["truncated/masked_rows"] = float(
                mask_rollouts(batch, truncated_rollouts(episodes, batch)))
        batch["temperature"] = np.full((rows,), temperature_at(self.config, step), np.float32)
        del batch["truncated"]
        device_batch, prep_metrics = self.prepare(*prepare_inputs(state),
                                                  self.runtime.device_batch(batch))
        state, update_metrics = self.update(state, device_batch)
        jax.block_until_ready(state.params)
        metrics.update(jax.device_get(prep_metrics))
        metrics.update(jax.device_get(update_metrics))
        return state, metrics

    def after_update(self, state, data, step: int, metrics: dict) -> None:
        groups, info, t0, t1 = data
        # Weight version v samples the episodes of step v (after v - 1 updates).
        self.source.push_weights(state.params, version=step + 2)
        t2 = time.perf_counter()
        episodes = [t for group in groups for t in group]
        success_key = self.rollouts.suite.success_key
        metrics.update({"time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
                        "time/step_s": t2 - t0,
                        "rollout/tokens_per_s": sum(t.rollout_action_tokens
                                                    for t in episodes) / (t1 - t0),
                        **info, "rollout/temperature": temperature_at(self.config, step),
                        "success/train": np.mean([solved(t, success_key)
                                                  for t in episodes])})

    def evaluate(self, step: int, state, metrics: dict) -> None:
        """The evaluation hook: held-out success with nothing rolling out."""
        with self.source.paused():
            self.last_eval = self.rollouts.evaluate(state.params, "eval", version=step + 1)
        metrics.update(self.last_eval)

    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['reward/mean']:.2f}", "success": f"{row['success/train']:.2f}",
                "ent": f"{row.get('entropy', 0):.2f}"}

    def on_log(self, step: int, row: dict) -> None:
        for warning in diagnostics.failure_warnings(
                row, max_action_tokens=episode_action_budget(self.config)):
            self.runtime.log(f"step {step}: warning: {warning}")

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
