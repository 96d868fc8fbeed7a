"""Which paged attention the JaxEngine's programs run, and how a Pallas kernel's block
tables are laid out.

"paged" is the pure-JAX loop over each row's pages (`models/paged.py`), fed a work list
of (row, page) items; "pallas_gpu" and "pallas_tpu" are Pallas kernels
(`models/paged_pallas.py`, `models/paged_pallas_tpu.py`) fed block tables of a fixed
width. Off their device the kernels run in Pallas's interpreters, for tests.

tests/engine/jax/test_engine_pallas.py.
"""
from __future__ import annotations

import warnings

import jax

from agentjax.config.choices import ENGINE_ATTENTION, KERNEL_PAGE_SIZES
from agentjax.models import paged_pallas, paged_pallas_tpu
from agentjax.models.paged_pallas import missing_backend


def resolve_attention(attention: str, platform: str, page_size: int) -> str:
    """The attention path of an engine whose weights are on `platform` ("cpu", "gpu",
    "tpu") with pages of `page_size` slots: "auto" is the Pallas kernel on a GPU (the
    pure-JAX path, with a warning, where this jax cannot compile it or the kernel cannot
    take the page size), else the pure-JAX paged attention. The TPU kernel runs only
    when asked for: no TPU has timed it against the pure-JAX path yet."""
    if attention not in ENGINE_ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ENGINE_ATTENTION))}, "
                         f"got {attention!r}")
    if attention in ("paged", "pallas_tpu"):
        return attention
    if attention == "auto" and platform != "gpu":
        return "paged"
    needs, takes = KERNEL_PAGE_SIZES["pallas_gpu"]
    missing = missing_backend() or (None if takes(page_size) else
                                    f"its page_size must be {needs}, not {page_size}")
    if missing is None:
        return "pallas_gpu"
    if attention == "pallas_gpu":
        raise ValueError(f"attention 'pallas_gpu': {missing}; use 'paged'")
    warnings.warn(f"JaxEngine: the GPU attention kernel cannot run ({missing}); the pure-JAX "
                  f"paged attention runs instead")
    return "paged"


def kernel_plan(attention: str, pages_per_row: int, page_size: int) -> tuple[int, int, int]:
    """(k_splits, pages per compute block, table width) of a Pallas kernel's block tables
    for rows of at most `pages_per_row` pages; refuses a page size it cannot take."""
    if attention == "pallas_tpu":
        return (1, paged_pallas_tpu.tpu_block_pages(page_size),
                paged_pallas_tpu.tpu_table_width(pages_per_row, page_size))
    return paged_pallas.split_plan(pages_per_row, page_size)


def kernel_mesh(cache) -> dict:
    """BlockTables' mesh and kv_head_axis for a pool whose kv heads are sharded over a
    multi-device mesh (`paged_pallas.over_kv_heads`), else {}."""
    sharding = cache.v[0].sharding
    if (not isinstance(sharding, jax.sharding.NamedSharding) or sharding.mesh.size == 1
            or len(sharding.spec) < 2 or sharding.spec[1] is None):
        return {}
    return {"mesh": sharding.mesh, "kv_head_axis": sharding.spec[1]}

