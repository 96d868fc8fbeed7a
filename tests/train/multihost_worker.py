"""One process of the two-process multi-host test (`tests/train/test_multihost.py`).

    python -m tests.train.multihost_worker --process-id 0 --num-processes 2 \
        --port 12345 --out /tmp/p0.npz

Each process starts JAX's distributed runtime over gloo through
`parallel.make_mesh({"distributed": ...})`, builds the same tiny model and batch as
`problem()` (deterministic), places only its own rows of the batch on a global
("data" across processes, "fsdp" within) mesh, runs one jitted update and writes the
gathered params and metrics to `--out`. The test imports `problem` and `make_update`
from here to compute the single-process reference with the very same code.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

from agentjax.core import parallel
from agentjax.models import Decoder, ModelConfig
from agentjax.rl import objectives
from agentjax.train import update as step_lib
from agentjax.config import default_config

B, T, V = 8, 16, 64
MODEL = ModelConfig(arch="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                    tie_embeddings=True, qkv_bias=True)
MESH = {"data": 2, "fsdp": 2, "tensor": 1}  # 2 processes x 2 devices
OPTIMIZER = optax.sgd(0.1)  # plain SGD: params differ exactly where gradients do


def make_model() -> Decoder:
    return Decoder(MODEL, rngs=nnx.Rngs(0))


def make_batch() -> dict[str, np.ndarray]:
    """A prepared RL batch ([B, T] and [B] arrays) with a KL term and masked rows."""
    rng = np.random.default_rng(0)
    mask = (rng.random((B, T)) < 0.6).astype(np.float32)
    mask[:, :4] = 0  # the prompt
    mask[5] = 0  # an all-masked row
    return dict(
        inputs=rng.integers(0, V, (B, T)).astype(np.int32),
        targets=rng.integers(0, V, (B, T)).astype(np.int32),
        positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids=np.ones((B, T), np.int32),
        loss_mask=mask,
        old_logp=(-rng.random((B, T)) * 4 * mask).astype(np.float32),
        ref_logp=(-rng.random((B, T)) * 4 * mask).astype(np.float32),
        advantages=(rng.standard_normal((B, 1)) * mask).astype(np.float32),
        temperature=np.full((B,), 0.9, np.float32))


def problem():
    """(graphdef, params, batch) of the reference run: an unsharded model and the batch."""
    graphdef, params = nnx.split(make_model())
    return graphdef, params, make_batch()


def make_update(graphdef: nnx.GraphDef):
    """The jitted update: 2 shuffled minibatches x 2 micro-batches, KL loss, entropy."""
    algo = default_config().algo
    algo.kl_coef = 0.01
    algo.entropy_coef = 0.001
    update = step_lib.build_update(objectives.rl_loss(graphdef, algo, chunk_size=8), OPTIMIZER,
                                   epochs=1, minibatches=2, micro_batches=2)
    return jax.jit(update)


def initial_state(params) -> step_lib.TrainState:
    return step_lib.TrainState(step=jnp.int32(0), params=params,
                               opt_state=OPTIMIZER.init(params), rng=jax.random.key(1))


def flatten(tree) -> dict[str, np.ndarray]:
    """Path-keyed numpy leaves (to save a params tree as npz and compare trees)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def place_rows(full: np.ndarray, sharding: jax.sharding.NamedSharding) -> jax.Array:
    """The global array whose process-local part is this process's block of rows.

    Each process passes only its own rows, as a trainer whose processes roll out their
    own episodes would; the data axis is process-major, so process p holds block p.
    """
    per_process = full.shape[0] // jax.process_count()
    start = jax.process_index() * per_process
    return jax.make_array_from_process_local_data(
        sharding, full[start:start + per_process], full.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True, help="npz file for params and metrics")
    args = parser.parse_args()

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    distributed = dict(coordinator_address=f"127.0.0.1:{args.port}",
                       num_processes=args.num_processes, process_id=args.process_id,
                       initialization_timeout=60)
    mesh = parallel.make_mesh({**MESH, "distributed": distributed})
    assert jax.process_count() == args.num_processes, jax.process_count()
    # "data" spans processes: each data slice lives on one process.
    for row in mesh.devices:
        assert len({d.process_index for d in row.flat}) == 1, mesh.devices

    model = parallel.create_sharded(make_model, mesh)
    graphdef, params = nnx.split(model)
    rows = parallel.batch_sharding(mesh, logical_axes=("batch",))
    tokens = parallel.batch_sharding(mesh)
    batch = {k: place_rows(v, tokens if v.ndim == 2 else rows) for k, v in make_batch().items()}
    state, metrics = make_update(graphdef)(initial_state(params), batch)

    params_out = flatten(multihost_utils.process_allgather(state.params, tiled=True))
    metrics_out = multihost_utils.process_allgather(metrics, tiled=True)
    np.savez(args.out, **params_out,
             **{f"metric:{k}": np.asarray(v) for k, v in metrics_out.items()})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
