"""agentjax.rl.aggregation: the modes by hand, global denominators, masked reductions."""
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config.choices import AGGREGATIONS
from agentjax.rl import aggregation


def test_aggregate_hand_computed():
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    expected = {"token-mean": 7 / 3, "seq-mean-token-mean": (1.5 + 4) / 2,
                "seq-mean-token-sum": 7 / 2, "seq-mean-token-sum-norm": 7 / (2 * 3)}
    for mode, value in expected.items():
        np.testing.assert_allclose(aggregation.aggregate(x, mask, mode), value, rtol=1e-6)
    np.testing.assert_allclose(
        aggregation.aggregate(x, mask, "seq-mean-token-sum-norm",
                              norm=aggregation.loss_norm(mask, constant=7)),
        7 / (2 * 7), rtol=1e-6)
    for mode in AGGREGATIONS:  # an all-masked batch aggregates to 0, never NaN
        assert aggregation.aggregate(x, jnp.zeros_like(mask), mode) == 0.0


def test_loss_norm_counts_the_full_batch():
    mask = jnp.array([[1, 1, 0], [0, 0, 0], [0, 1, 0]])
    norm = aggregation.loss_norm(mask)
    assert (float(norm.num_tokens), float(norm.num_seqs), float(norm.constant)) == (3, 2, 3)
    norm = aggregation.loss_norm(jnp.zeros_like(mask), constant=5)
    assert (float(norm.num_tokens), float(norm.num_seqs), float(norm.constant)) == (1, 1, 5)


def test_masked_mean_and_extreme():
    x = jnp.array([[1.0, np.nan, 3.0], [-2.0, 7.0, np.inf]])
    mask = jnp.array([[1, 0, 1], [1, 1, 0]])
    np.testing.assert_allclose(aggregation.masked_mean(x, mask), 9.0 / 4, rtol=1e-6)
    assert float(aggregation.masked_mean(x, jnp.zeros_like(mask))) == 0.0
    valid = mask.astype(bool)
    assert float(aggregation.masked_extreme(x, valid, jnp.max, 0.0)) == 7.0
    assert float(aggregation.masked_extreme(x, valid, jnp.min, 0.0)) == -2.0
    assert float(aggregation.masked_extreme(x, ~jnp.ones_like(valid), jnp.max, 1.0)) == 1.0


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="mode"):
        aggregation.aggregate(x, x, "mean")
    with pytest.raises(ValueError, match="constant"):
        aggregation.loss_norm(x, constant=0)
    with pytest.raises(ValueError, match="mask"):
        aggregation.loss_norm(jnp.zeros(3))
