"""Sharded vs single-device: one check for every loss whose rows may be split over the
data axis."""
import chex
import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec


def assert_rows_sharded_match_one_device(fn, args, devices, *, argnums=0):
    """jit(value_and_grad(fn, argnums, has_aux=True)) with every arg's rows split over
    `devices` equals it on the first device alone: loss, gradients (sharded as their
    arguments) and metrics, within float32 rounding of reordered sums."""
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,),
                         devices=devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    grad_fn = jax.jit(jax.value_and_grad(fn, argnums=argnums, has_aux=True))
    (loss, metrics), grad = grad_fn(*(jax.device_put(x, devices[0]) for x in args))
    (s_loss, s_metrics), s_grad = grad_fn(*(jax.device_put(x, rows) for x in args))
    for leaf in jax.tree.leaves(s_grad):
        assert leaf.sharding.is_equivalent_to(rows, leaf.ndim)
    np.testing.assert_allclose(s_loss, loss, rtol=1e-6)
    chex.assert_trees_all_close(s_grad, grad, rtol=1e-6, atol=1e-8)
    # atol: means of O(1) values that nearly cancel (an advantage mean ~ 0.02) differ by
    # the absolute rounding of a reordered float32 sum, not by a relative amount.
    chex.assert_trees_all_close(s_metrics, metrics, rtol=1e-6, atol=1e-7)
