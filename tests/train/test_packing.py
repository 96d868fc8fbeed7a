"""Packed SFT batches: the same loss as one episode per row."""
import numpy as np
from flax import nnx

from agentjax.models import Decoder, ModelConfig
from agentjax.rl.aggregation import loss_norm
from agentjax.rl.objectives import sft_loss
from agentjax.core.trajectory import Trajectory, Turn, collate
from agentjax.train.packing import pack

V = 50
CONFIG = ModelConfig(arch="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                     num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                     tie_embeddings=True, qkv_bias=True)


def _trajectory(rng, prompt, actions):
    turns = [Turn(list(rng.integers(1, V, n)), [0.0] * n, "stop", list(rng.integers(1, V, 3)))
             for n in actions]
    return Trajectory(prompt_ids=list(rng.integers(1, V, prompt)), turns=turns)


def test_packed_loss_equals_one_episode_per_row():
    rng = np.random.default_rng(0)
    trajs = [_trajectory(rng, p, a) for p, a in [(5, (3, 2)), (7, (4,)), (3, (2, 2, 2)),
                                                 (9, (5,)), (4, (1,))]]
    packed, used = pack(trajs, length=32, rows=3, pad_id=0)
    assert used == len(trajs)
    assert packed["segment_ids"].max() >= 2  # some row really holds several episodes
    plain = collate(trajs, buckets=(32,), pad_id=0)
    graphdef, params = nnx.split(Decoder(CONFIG, rngs=nnx.Rngs(0)))
    loss_fn = sft_loss(graphdef, chunk_size=32)

    def loss(batch):
        batch = {k: batch[k] for k in ("inputs", "targets", "positions", "segment_ids")} | {
            "loss_mask": batch["action_mask"]}
        return loss_fn(params, batch, loss_norm(batch["loss_mask"]))[0]

    assert packed["action_mask"].sum() == plain["action_mask"].sum()
    np.testing.assert_allclose(loss(packed), loss(plain), rtol=1e-5)


def test_pack_stops_at_the_first_episode_that_does_not_fit():
    rng = np.random.default_rng(1)
    trajs = [_trajectory(rng, 10, (10,)) for _ in range(5)]  # 10 + 10 + 3 - 1 = 22 each
    packed, used = pack(trajs, length=50, rows=2, pad_id=0)
    assert used == 4
    assert (packed["segment_ids"].max(axis=1) == 2).all()
