"""On-policy distillation (rl/distillation.py) and its place in `prepare`: float64
references (tests/reference.py: distill_advantages), hand values, the identity teacher,
the per-token gradient, observation masking, eager and jit."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from agentjax.rl import distillation, losses
from agentjax.rl.prepare import build_prepare
from tests import reference as ref
from tests.rl.test_prepare import (ACTION, CURRENT, DR_GRPO, NUM_GROUPS, REF, RESPONSE, B, T,
                                   fake_logprob_fn, make_algo, make_batch, per_row)

TOL = dict(rtol=1e-6, atol=1e-6)
# The teacher's log-probs: CURRENT shifted by a different amount on every token.
TEACHER = (CURRENT + 0.05 * np.arange(B * T, dtype=np.float32).reshape(B, T) - 0.7
           ).astype(np.float32)


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def jit(request):
    return (lambda f: jax.jit(f)) if request.param else (lambda f: f)


def test_hand_values(jit):
    teacher = np.array([[-1.0, -2.0, np.nan, -0.5], [-3.0, -np.inf, -1.0, -1.0]], np.float32)
    student = np.array([[-1.5, -1.0, -1.0, -0.5], [-1.0, -1.0, -2.0, -9.0]], np.float32)
    action = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], np.float32)
    signal = jit(distillation.distill_advantages)(teacher, student, action)
    # Scored: finite teacher log-prob on an action token; the NaN and -inf are not.
    np.testing.assert_allclose(signal, [[0.5, -1.0, 0, 0], [-2.0, 0, 1.0, 0]], **TOL)
    combined = jit(lambda a, s, m: distillation.combine(a, s, m, coef=2.0, task_weight=0.5))(
        np.array([4.0, -2.0], np.float32), signal, action)
    np.testing.assert_allclose(combined, [[3.0, 0.0, 2.0, 0], [-5.0, -1.0, 1.0, 0]], **TOL)
    metrics = jit(distillation.distill_metrics)(teacher, student, action)
    # k1 = student - teacher on the 4 scored tokens: -0.5, 1, 2, -1.
    np.testing.assert_allclose(metrics["distill/kl_k1"], 0.375, **TOL)
    k3 = np.mean([np.exp(-d) + d - 1 for d in (-0.5, 1.0, 2.0, -1.0)])
    np.testing.assert_allclose(metrics["distill/kl_k3"], k3, **TOL)
    np.testing.assert_allclose(metrics["distill/scored_frac"], 4 / 6, **TOL)


@pytest.mark.parametrize("per_token_task", [False, True])
def test_matches_the_float64_reference(jit, per_token_task):
    rng = np.random.default_rng(0)
    teacher = rng.normal(-2, 1, (4, 9)).astype(np.float32)
    teacher[1, 3] = -np.inf
    student = rng.normal(-2, 1, (4, 9)).astype(np.float32)
    action = (rng.random((4, 9)) < 0.6).astype(np.float32)
    loss_mask = np.maximum(action, (rng.random((4, 9)) < 0.3)).astype(np.float32)
    task = rng.normal(size=(4, 9) if per_token_task else (4,)).astype(np.float32)

    def f(task, teacher, student, loss_mask, action):
        signal = distillation.distill_advantages(teacher, student, action)
        return (distillation.combine(task, signal, loss_mask, coef=0.7, task_weight=0.3),
                distillation.distill_metrics(teacher, student, action))

    got, metrics = jit(f)(task, teacher, student, loss_mask, action)
    want, (k1, k3, frac) = ref.distill_advantages(task, teacher, student, loss_mask, action,
                                                  coef=0.7, task_weight=0.3)
    chex.assert_shape(got, (4, 9))
    chex.assert_type(got, jnp.float32)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose([metrics["distill/kl_k1"], metrics["distill/kl_k3"],
                                metrics["distill/scored_frac"]], [k1, k3, frac], **TOL)


def run_prepare(algo, jit, *, teacher=TEACHER, loss_on_observations=False):
    prepare = jit(build_prepare(fake_logprob_fn, algo, num_groups=NUM_GROUPS,
                                loss_on_observations=loss_on_observations,
                                teacher_logprob_fn=fake_logprob_fn))
    out, metrics = prepare(jnp.asarray(CURRENT), jnp.asarray(REF), None, make_batch(),
                           teacher_params=jnp.asarray(teacher))
    return jax.device_get(out), jax.device_get(metrics)


@pytest.mark.parametrize("loss_on_observations", [False, True])
def test_prepare_adds_the_teacher_signal_on_action_tokens_only(jit, loss_on_observations):
    algo = make_algo(distill_coef=0.5, distill_task_weight=2.0)
    out, metrics = run_prepare(algo, jit, loss_on_observations=loss_on_observations)
    mask = RESPONSE if loss_on_observations else ACTION
    want, (k1, k3, frac) = ref.distill_advantages(DR_GRPO, TEACHER, CURRENT, mask, ACTION,
                                                  coef=0.5, task_weight=2.0)
    np.testing.assert_allclose(out["advantages"], want, **TOL)
    # Observation tokens (in the loss with loss_on_observations) get the task advantage
    # alone: the teacher never scores them.
    observations = (mask > 0) & (ACTION == 0)
    np.testing.assert_allclose(out["advantages"][observations],
                               (2.0 * per_row(DR_GRPO, mask))[observations], **TOL)
    np.testing.assert_allclose([metrics["distill/kl_k1"], metrics["distill/kl_k3"],
                                metrics["distill/scored_frac"]], [k1, k3, frac], **TOL)
    assert frac == 1.0 and k1 > 0


def test_a_teacher_equal_to_the_student_adds_nothing(jit):
    """The teacher scoring with the student's params: zero signal, the advantages (and so
    the loss) of the run without a teacher, KL 0, every action token scored."""
    algo = make_algo(distill_coef=1.0, distill_task_weight=1.0)
    out, metrics = run_prepare(algo, jit, teacher=CURRENT)
    plain = jit(build_prepare(fake_logprob_fn, make_algo(), num_groups=NUM_GROUPS))
    want, _ = plain(jnp.asarray(CURRENT), jnp.asarray(REF), None, make_batch())
    want = jax.device_get(want)
    np.testing.assert_array_equal(out["advantages"], per_row(DR_GRPO, ACTION))
    assert metrics["distill/kl_k1"] == 0 and metrics["distill/kl_k3"] == 0
    assert metrics["distill/scored_frac"] == 1

    def loss(batch):
        return losses.rl_objective(jnp.asarray(CURRENT) * 1.0, batch["old_logp"],
                                   batch["advantages"], batch["loss_mask"], kind="ppo",
                                   agg="token-mean", clip_low=0.2, clip_high=0.2)[0]

    assert float(loss(out)) == float(loss(want))


def test_per_token_gradient_is_the_teacher_signal(jit):
    """Distillation alone (task weight 0) through the PPO loss at ratio 1, token-mean: d
    loss / d log pi_t = -coef (log pi_teacher_t - log pi_student_t) / N on action tokens,
    0 elsewhere (the policy-gradient of the per-token reverse KL, discount 0)."""
    coef = 0.5
    out, _ = run_prepare(make_algo(distill_coef=coef, distill_task_weight=0.0), jit)

    def loss(logp):
        return losses.rl_objective(logp, out["old_logp"], out["advantages"],
                                   out["loss_mask"], kind="ppo", agg="token-mean",
                                   clip_low=0.2, clip_high=0.2)[0]

    grad = jit(jax.grad(loss))(jnp.asarray(CURRENT))
    want = np.where(ACTION > 0, -coef * (TEACHER.astype(np.float64) - CURRENT), 0.0)
    np.testing.assert_allclose(grad, want / ACTION.sum(), **TOL)


def test_a_teacher_weight_without_a_teacher_is_a_setup_error():
    with pytest.raises(ValueError, match="distill_coef=0.5 needs the teacher"):
        build_prepare(fake_logprob_fn, make_algo(distill_coef=0.5), num_groups=NUM_GROUPS)


def test_sharded_matches_single_device(eight_devices):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=eight_devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    rng = np.random.default_rng(1)
    teacher, student = (rng.normal(-2, 1, (8, 7)).astype(np.float32) for _ in range(2))
    action = (rng.random((8, 7)) < 0.6).astype(np.float32)
    task = rng.normal(size=(8,)).astype(np.float32)

    @jax.jit
    def f(task, teacher, student, action):
        signal = distillation.distill_advantages(teacher, student, action)
        return (distillation.combine(task, signal, action, coef=0.7, task_weight=0.3),
                distillation.distill_metrics(teacher, student, action))

    args = (task, teacher, student, action)
    single = f(*(jax.device_put(x, eight_devices[0]) for x in args))
    sharded = f(*(jax.device_put(x, rows) for x in args))
    chex.assert_trees_all_close(sharded, single, rtol=1e-6, atol=1e-6)
