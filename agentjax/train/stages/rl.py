"""The RL stage: each step takes groups from the rollout source, updates the policy on
them, then runs the hooks due (evaluation, logging with warnings, checkpoint).

    params, last_eval = run_rl(trainer, params)

One step, in `run_rl`:
    groups = source.next_groups(step)                 P groups of G episodes: sync,
                                                      `collect_groups` (tasks -> groups;
                                                      hindsight relabeling; DAPO: dynamic
                                                      sampling, overlong shaping), or
                                                      async, a producer running ahead
                                                      (train/rollout_source)
    state, metrics = rl_step(state, groups, step)     collate -> prepare (log-probs,
                                                      advantages) -> jitted update ->
                                                      non-finite guard
    source.push_weights(state.params, step + 2)       the engine samples with the update
    run_hooks(hooks, step + 1, ...)                   eval / log / checkpoint

The Trainer (train/trainer.py) supplies the model, engine, pool, shardings and the
restore-or-start of checkpoints; a rerun in the same workdir resumes at the last
committed step with the same sampler state and sampling seeds (`Trainer.sampling`).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from agentjax.data.curriculum import make_sampler
from agentjax.models import ValueModel
from agentjax.rl.shaping import dynamic_sampling_keep, overlong_penalty
from agentjax.engine.protocol import EnginesUnavailable
from agentjax.core.trajectory import Trajectory, collate
from agentjax.train import diagnostics
from agentjax.train import update as step_lib
from agentjax.train.episodes import check_failures
from agentjax.agents.evaluation import solved
from agentjax.agents.hindsight import hindsight_groups
from agentjax.train.hooks import Hook, run_hooks
from agentjax.train.precision import master_copy
from agentjax.train.prepare import build_prepare, critic_value_fn, model_logprob_fn
# A module import: rollout_source imports this module back (collect_groups).
from agentjax.agents import sources as rollout_source


class TrainingDiverged(RuntimeError):
    """Optimizer updates stayed non-finite for optim.max_nonfinite_steps steps."""


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


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def init_rl_state(trainer, params):
    """(TrainState, optimizer, critic graphdef, critic optimizer) of an RL run from
    `params`: float32 masters, a critic initialized from the policy (GAE only), a frozen
    reference copy (KL, or the DPO stage's reference)."""
    config, algo = trainer.config, trainer.config.algo
    optimizer = step_lib.make_optimizer(
        config.optim.lr, total_steps=optimizer_updates(config),
        warmup_steps=config.optim.warmup_steps, schedule=config.optim.schedule,
        weight_decay=config.optim.weight_decay, b1=config.optim.b1, b2=config.optim.b2,
        grad_clip=config.optim.grad_clip)
    critic_graphdef = critic_optimizer = critic_params = critic_opt_state = None
    params = master_copy(params)
    if algo.advantage == "gae":
        critic = ValueModel(nnx.merge(trainer.graphdef, _copy(params)))
        critic_graphdef, critic_params = nnx.split(critic)
        critic_optimizer = optax.chain(optax.clip_by_global_norm(config.optim.grad_clip),
                                       optax.adamw(algo.critic_lr))
        critic_opt_state = critic_optimizer.init(critic_params)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params),
                                rng=jax.random.key(config.seed),
                                critic_params=critic_params,
                                critic_opt_state=critic_opt_state,
                                ref_params=_copy(params) if algo.kl_coef > 0
                                or config.stage == "dpo" else None)
    return state, optimizer, critic_graphdef, critic_optimizer


def build_rl_update(trainer, params):
    """(initial state, update(state, batch), prepare(params, ref, critic, batch)) of the
    configured algorithm, jitted."""
    config, algo = trainer.config, trainer.config.algo
    state, optimizer, critic_graphdef, critic_optimizer = init_rl_state(trainer, params)
    policy_loss = step_lib.rl_loss(trainer.graphdef, algo, chunk_size=config.model.logprob_chunk)
    critic_loss = (step_lib.value_loss_fn(critic_graphdef, algo) if critic_graphdef
                   else None)
    update, state = trainer.jit_update(step_lib.build_update(
        policy_loss, optimizer, epochs=algo.ppo_epochs, minibatches=algo.minibatches,
        micro_batches=trainer.micro_batches(trainer.batch_rows // algo.minibatches),
        norm_constant=algo.agg_constant or None, critic_loss_fn=critic_loss,
        critic_optimizer=critic_optimizer, critic_warmup_steps=algo.critic_warmup_steps),
        state)
    prepare = jax.jit(build_prepare(
        model_logprob_fn(trainer.graphdef, chunk_size=config.model.logprob_chunk), algo,
        num_groups=config.rollout.prompts_per_step,
        mask_observations=config.env.mask_observations,
        value_fn=critic_value_fn(critic_graphdef) if critic_graphdef else None,
        offpolicy_metrics=config.rollout.mode == "async"))
    return state, update, prepare


def shape_overlong(trajectories: list[Trajectory], algo) -> None:
    """DAPO overlong shaping: penalize episodes whose action tokens enter the last
    `algo.overlong_buffer` tokens before `algo.overlong_max_len` (added to the final
    reward, recorded as the "overlong" reward component)."""
    lengths = np.array([t.num_action_tokens for t in trajectories], np.float32)
    penalties = np.asarray(overlong_penalty(
        lengths, max_len=algo.overlong_max_len, buffer=algo.overlong_buffer,
        factor=algo.overlong_factor))
    for traj, penalty in zip(trajectories, penalties):
        traj.final_reward += float(penalty)
        traj.metadata.setdefault("reward_components", {})["overlong"] = float(penalty)


def collect_groups(trainer, sampler, step: int):
    """One step's groups, numbered in order, and rollout metrics. With data.hindsight,
    groups that solved nothing are relabeled (agents/hindsight.py) after the curriculum
    has seen how they did. With dynamic sampling (DAPO), groups whose rewards are all
    equal are set aside and more tasks drawn until the batch is full; if the rounds run
    out, set-aside groups (zero advantage: no policy-gradient signal) fill the batch."""
    config, r = trainer.config, trainer.config.rollout
    kept, set_aside, rounds, relabeled = [], [], 0, 0
    while len(kept) < r.prompts_per_step:
        drawn = sampler.sample(r.prompts_per_step - len(kept))
        collected = trainer.pool.collect_sync(
            drawn, r.group_size, sampling=trainer.sampling(step, seed_index=step * 100 + rounds),
            first_group_id=0)
        sampler.update(drawn, [np.mean([solved(t, trainer.suite.success_key) for t in g])
                               for g in collected])
        if config.data.hindsight:
            collected, count = hindsight_groups(trainer, collected)
            relabeled += count
        if config.algo.overlong_buffer:
            shape_overlong([t for group in collected for t in group], config.algo)
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
    for group_index, group in enumerate(groups):
        for traj in group:
            traj.group_id = group_index
    info = {"rollout/rounds": rounds, "rollout/kept_groups": len(kept)}
    if config.data.hindsight:
        info["rollout/hindsight_groups"] = relabeled
    return groups, info


def inspect_episodes(trainer, groups, step: int, first: bool, stage: str = "rl") -> None:
    """Records the episodes' errors and samples; warns when many failed (stops when all
    of the first step's did: `check_failures`)."""
    episodes = [t for group in groups for t in group]
    for message in trainer.recorder.record(step, stage, episodes):
        trainer.log(f"step {step}: new episode error: {message}")
    warning = check_failures(episodes, where=f"{stage.upper()} step {step}", fatal=first)
    if warning:
        trainer.log(f"step {step}: warning: {warning}")


def guard_nonfinite(trainer, state, metrics, step: int, bad_steps: int, checkpointer,
                    host: dict):
    """Reacts to optimizer updates the jitted update refused (non-finite loss, gradient
    or params; `step_lib.epoch_minibatch_steps`): warns, rolls the policy back to the
    last checkpoint when optim.on_nonfinite='rollback', and after
    optim.max_nonfinite_steps consecutive such steps saves a checkpoint and stops.
    Returns (state, consecutive bad steps)."""
    optim = trainer.config.optim
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
        trainer.log(f"warning: {where}; rolled the policy back to checkpoint "
                    f"{checkpointer.latest_step}")
        return restored, bad_steps
    trainer.log(f"warning: {where}; skipped")
    return state, bad_steps


def run_rl(trainer, params):
    """RL from `params` for total_steps (resuming from the workdir's last committed
    checkpoint); exports to <workdir>/hf and returns (final params, last eval metrics)."""
    config = trainer.config
    state, update, prepare = build_rl_update(trainer, params)
    sampler = make_sampler(config.data.curriculum, trainer.suite.train_tasks, seed=config.seed)
    state, host, checkpointer, writer = trainer.restore_or_start(trainer.workdir, state, "RL")
    start, last_eval = host.get("step", 0), host.get("last_eval", {})
    source = rollout_source.make_source(trainer, sampler, state.params, start=start,
                                        host=host)
    bar = tqdm(range(start, config.total_steps), desc=config.algo.name,
               disable=not (trainer.is_main and config.log.progress))
    bad_steps = 0

    def host_state(done: int) -> dict:
        """What a resumed run needs after `done` steps, beyond the device state."""
        return {"step": done, **source.state_dict(), "last_eval": last_eval}

    def rl_step(state, groups, step: int):
        """The update on one step's groups (the loop then hands its weights to the
        rollout source)."""
        nonlocal bad_steps
        trajectories = [t for group in groups for t in group]
        batch = collate(trajectories, buckets=trainer.buckets,
                        pad_id=trainer.tokenizer.pad_token_id, batch_size=trainer.batch_rows)
        metrics = diagnostics.rollout_metrics(groups, batch)
        batch["temperature"] = np.full((trainer.batch_rows,), temperature_at(config, step),
                                       np.float32)
        del batch["truncated"]
        device_batch, prep_metrics = prepare(state.params, state.ref_params,
                                             state.critic_params, trainer.device_batch(batch))
        state, update_metrics = update(state, device_batch)
        jax.block_until_ready(state.params)
        metrics.update(jax.device_get(prep_metrics))
        metrics.update(jax.device_get(update_metrics))
        state, bad_steps = guard_nonfinite(trainer, state, metrics, step + 1, bad_steps,
                                           checkpointer, host_state(step + 1))
        return state, metrics

    def evaluate(step, state, metrics):
        nonlocal last_eval
        with source.paused():
            last_eval = trainer.evaluate(state.params, "eval", version=step + 1)
        metrics.update(last_eval)

    def log(step, state, metrics):
        row = writer.write(step, metrics)
        bar.set_postfix(reward=f"{row['reward/mean']:.2f}",
                        success=f"{row['success/train']:.2f}",
                        ent=f"{row.get('entropy', 0):.2f}")
        for warning in diagnostics.failure_warnings(
                row, max_action_tokens=episode_action_budget(config)):
            trainer.log(f"step {step}: warning: {warning}")

    def save(step, state, metrics):
        checkpointer.save(step, state, host_state(step), force=True)

    # In this order: the log row holds the evaluation, the checkpoint its result.
    hooks = [Hook(config.eval.every, evaluate), Hook(config.log.every, log),
             Hook(config.checkpoint.every, save)]
    try:
        for step in bar:
            # Where a rerun would continue if the rollout stops (servers down, the async
            # producer failed): this step, with the rollout source's state before its
            # groups; None while the state holds an update whose log row and evaluation
            # are not written yet (a rerun then repeats from the last checkpoint, which
            # reproduces them).
            resume = (step, host_state(step))
            try:
                t0 = time.perf_counter()
                groups, rollout_info = source.next_groups(step)
                t1 = time.perf_counter()
                inspect_episodes(trainer, groups, step + 1, first=step == start)
                resume = None
                state, metrics = rl_step(state, groups, step)
                # Weight version v samples the episodes of step v (after v - 1 updates).
                source.push_weights(state.params, version=step + 2)
                t2 = time.perf_counter()
                episodes = [t for group in groups for t in group]
                metrics.update({"time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
                                "time/step_s": t2 - t0,
                                "rollout/tokens_per_s": sum(t.num_action_tokens
                                                            for t in episodes) / (t1 - t0),
                                **rollout_info,
                                "rollout/temperature": temperature_at(config, step),
                                "success/train": np.mean([
                                    solved(t, trainer.suite.success_key) for t in episodes])})
                run_hooks(hooks, step + 1, config.total_steps, state, metrics)
            except (EnginesUnavailable, rollout_source.RolloutProducerError):
                if resume is not None:
                    checkpointer.save(resume[0], state, resume[1], force=True)
                checkpointer.wait()
                raise
    finally:
        source.close()
    checkpointer.wait()
    writer.close()
    trainer.export(state.params, "")
    return state.params, last_eval
