"""The checks every paged-attention kernel passes (`test_paged_pallas.py` for the GPU
kernel, `test_paged_pallas_tpu.py` for the TPU one). Each takes `attend(scene)`: the
kernel's output [R, T, H, hd] for a scene of `test_paged.make_scene` (keys "page_hd"),
its new tokens written first, block tables built from the scene's "held" pages."""
import jax
import jax.numpy as jnp
import numpy as np

from agentjax.models.paged import AttentionItems, build_items, paged_attention, write_pages
from agentjax.models.paged_pallas import block_table
from tests.models.test_paged import make_scene, reference

PAGE = 16
# (cached lengths, new tokens) per row.
SCENES = [([0, 21, 40], [9, 5, 1]),          # prefill from empty and append
          ([0, 3], [40, 20]),                # prefill over several pages
          ([3, 47, 0, 16], [1, 1, 1, 1])]    # decode, one row at a page edge
# rows, tokens, heads, kv heads, head_dim, page, max_len, dtype
LOWERING_SHAPES = [
    (64, 1, 16, 2, 128, 64, 2048, jnp.bfloat16),     # Qwen2.5-3B decode (device bench)
    (8, 256, 16, 2, 128, 64, 2048, jnp.bfloat16),    # its prefill chunk
    (64, 1, 14, 2, 64, 64, 2048, jnp.bfloat16),      # Qwen2.5-0.5B decode
    (4, 256, 28, 4, 128, 64, 32768, jnp.bfloat16),   # Qwen2.5-7B, a 32k row
    (2, 1, 16, 2, 128, 512, 1000, jnp.float32),      # pages bigger than a compute block
]


def kernel_args(scene) -> list:
    """The arrays of a scene, for a jitted kernel call after `write_pages`."""
    return ([jnp.asarray(scene[n], jnp.float32)
             for n in ("q", "k_pool", "v_pool", "new_k", "new_v")]
            + [jnp.asarray(scene["slots"]), jnp.asarray(scene["write"])])


def scene_table(scene, width: int) -> jax.Array:
    """[R, width] the scene's pages per row (`paged_pallas.block_table`)."""
    return jnp.asarray(block_table(scene["held"], len(scene["held"]), width))


def check_float64(attend) -> None:
    for lengths, new in SCENES:
        scene = make_scene(0, lengths, new, "page_hd", page_size=PAGE)
        out = np.asarray(attend(scene))
        expected = reference(scene["q"], scene["keys"], scene["values"], lengths,
                             scene["slots"])
        np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
        assert not out[scene["slots"] < 0].any()  # padding queries read zeros


def check_pure_jax(attend) -> None:
    scene = make_scene(1, [5, 30, 12], [4, 1, 7], "page_hd", page_size=PAGE)
    items = build_items(scene["held"], scene["total"], 3, PAGE, 16)
    items = AttentionItems(*(jnp.asarray(x) for x in (items.row, items.page, items.first_slot)))

    @jax.jit
    def pure(q, k_pool, v_pool, new_k, new_v, slots, write):
        k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
        return paged_attention(q, k_pool, v_pool, slots, items, "page_hd")

    np.testing.assert_allclose(np.asarray(attend(scene)),
                               np.asarray(pure(*kernel_args(scene))), rtol=1e-5, atol=1e-6)


def check_row_independence(attend, new) -> None:
    """Deterministic mode's property: row 1 alone (the others padding), among other rows,
    and in a bigger batch at another position give the same bits."""
    scene = make_scene(2, [5, 37, 2], new, "page_hd", page_size=PAGE)
    crowd = np.asarray(attend(scene))
    alone = dict(scene, held=[[], scene["held"][1], []])
    for name in ("slots", "write"):
        alone[name] = np.where(np.arange(3)[:, None] == 1, scene[name], -1)
    assert np.array_equal(crowd[1], np.asarray(attend(alone))[1])
    bigger = {name: np.concatenate([scene[name][1:], scene[name]]) for name in
              ("q", "new_k", "new_v", "slots", "write")}
    out = np.asarray(attend(dict(scene, **bigger, held=scene["held"][1:] + scene["held"])))
    assert np.array_equal(out[0], crowd[1]) and np.array_equal(out[3], crowd[1])


def lowered(attend, shape, width: int, platform: str) -> str:
    """The text of `attend(q, k_pool, v_pool, slots, table)` lowered for `platform` at a
    LOWERING_SHAPES shape, with tables `width` pages wide."""
    rows, tokens, heads, kv_heads, hd, page, max_len, dtype = shape
    pool = jax.ShapeDtypeStruct((rows * -(-max_len // page), kv_heads, page, hd), dtype)
    args = (jax.ShapeDtypeStruct((rows, tokens, heads, hd), dtype), pool, pool,
            jax.ShapeDtypeStruct((rows, tokens), jnp.int32),
            jax.ShapeDtypeStruct((rows, width), jnp.int32))
    return jax.jit(attend).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def check_over_kv_heads(kernel, tables, devices) -> None:
    """On a pool sharded over kv heads ("tensor" of a 4 x 2 mesh), `over_kv_heads` runs
    the kernel on each device's heads (it is traced with half of them) with the
    outputs of one device, and the program gathers nothing. `tables`: the kernel's
    block tables, their table replaced by the scene's of the same width."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from agentjax.models.paged_pallas import over_kv_heads

    mesh = Mesh(np.asarray(devices).reshape(4, 2), ("fsdp", "tensor"))
    scene = make_scene(5, [21, 3], [1, 9], "page_hd", page_size=PAGE)
    q, k_pool, v_pool, new_k, new_v, slots, write = kernel_args(scene)
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    tables = tables.replace(table=scene_table(scene, tables.table.shape[1]))
    expected = np.asarray(jax.jit(kernel)(q, k_pool, v_pool, slots, tables))
    heads = []

    def traced(q, *args):
        heads.append(q.shape[2])
        return kernel(q, *args)

    pool = NamedSharding(mesh, PartitionSpec(None, "tensor", None, None))
    sharded = tables.replace(mesh=mesh, kv_head_axis="tensor")
    attend = jax.jit(lambda *args: over_kv_heads(traced, sharded)(*args, sharded))
    args = (q, jax.device_put(k_pool, pool), jax.device_put(v_pool, pool), slots)
    np.testing.assert_array_equal(np.asarray(attend(*args)), expected)
    assert heads == [q.shape[2] // 2]
    assert "all-gather" not in attend.lower(*args).compile().as_text()
