"""Paged KV pool and ragged paged attention against a float64 reference."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.config import ModelConfig
from agentjax.models.paged import (AttentionItems, PagedKVCache, ViewItems, _ordered_sum,
                                   build_items, copy_slots, gather_view, init_paged_cache,
                                   items_needed, page_bytes, paged_attention, read_slots,
                                   view_attention, view_index, write_pages)

PAGE, K, G, HD = 4, 2, 3, 8


def reference(q, keys, values, lengths, q_slots):
    """float64 causal GQA attention of row r's queries over its first lengths[r] keys.
    q [R, T, H, hd]; keys / values per row [S_r, K, hd]."""
    r, t, h, hd = q.shape
    out = np.zeros((r, t, h, hd))
    for row in range(r):
        for i in range(t):
            s = q_slots[row, i]
            if s < 0:
                continue
            for head in range(h):
                kv = head // (h // K)
                scores = keys[row][:s + 1, kv] @ q[row, i, head] / np.sqrt(hd)
                p = np.exp(scores - scores.max())
                out[row, i, head] = (p / p.sum()) @ values[row][:s + 1, kv]
    return out


def make_scene(seed, lengths, new, key_layout="hd_page", page_size=PAGE):
    """A pool holding rows of `lengths` cached slots in shuffled pages, plus `new` tokens
    per row to append (right-padded: row r appends new[r]); keys in `key_layout`."""
    rng = np.random.default_rng(seed)
    rows, t = len(lengths), max(new)
    need = [-(-(length + n) // page_size) for length, n in zip(lengths, new)]
    pages = rng.permutation(sum(need) + 3).tolist()
    held, at = [], 0
    for n in need:
        held.append(pages[at:at + n])
        at += n
    total = [length + n for length, n in zip(lengths, new)]
    keys = [rng.standard_normal((s, K, HD)) for s in total]
    values = [rng.standard_normal((s, K, HD)) for s in total]
    v_pool = np.zeros((len(pages), K, page_size, HD))
    k_pool = (np.zeros((len(pages), K, HD, page_size)) if key_layout == "hd_page"
              else v_pool.copy())
    for row in range(rows):
        for s in range(lengths[row]):  # the cached part; the new part is written by the test
            page, off = held[row][s // page_size], s % page_size
            if key_layout == "hd_page":
                k_pool[page, :, :, off] = keys[row][s]
            else:
                k_pool[page, :, off] = keys[row][s]
            v_pool[page, :, off] = values[row][s]
    slots = np.full((rows, t), -1, np.int32)
    write = np.full((rows, t), -1, np.int32)
    new_k = np.zeros((rows, t, K, HD))
    new_v = np.zeros((rows, t, K, HD))
    for row in range(rows):
        for i in range(new[row]):
            s = lengths[row] + i
            slots[row, i] = s
            write[row, i] = held[row][s // page_size] * page_size + s % page_size
            new_k[row, i], new_v[row, i] = keys[row][s], values[row][s]
    q = rng.standard_normal((rows, t, K * G, HD))
    return dict(q=q, k_pool=k_pool, v_pool=v_pool, new_k=new_k, new_v=new_v, slots=slots,
                write=write, held=held, total=total, keys=keys, values=values,
                key_layout=key_layout)


def _run(scene, size, dtype=jnp.float32, jit=True):
    items = build_items(scene["held"], scene["total"], len(scene["held"]), PAGE, size)
    items = AttentionItems(*(jnp.asarray(x) for x in (items.row, items.page,
                                                      items.first_slot)))
    layout = scene["key_layout"]

    def call(q, k_pool, v_pool, new_k, new_v, slots, write):
        k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, layout)
        return paged_attention(q, k_pool, v_pool, slots, items, layout), k_pool, v_pool

    call = jax.jit(call) if jit else call
    args = [jnp.asarray(scene[n], dtype) for n in ("q", "k_pool", "v_pool", "new_k", "new_v")]
    return call(*args, jnp.asarray(scene["slots"]), jnp.asarray(scene["write"]))


@pytest.mark.parametrize("jit", [True, False])
def test_prefill_and_decode_match_the_float64reference(jit):
    with jax.enable_x64():
        for lengths, new in [([0, 5, 9], [7, 3, 1]),       # prefill from empty and append
                             ([3, 12, 0, 7], [1, 1, 1, 1])]:  # decode
            scene = make_scene(0, lengths, new)
            size = -(-items_needed(scene["total"], PAGE) // 8) * 8 + 8  # padding items too
            out, _, _ = _run(scene, size, jnp.float64, jit)
            expected = reference(scene["q"], scene["keys"], scene["values"], lengths,
                                  scene["slots"])
            np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)
            padding = scene["slots"] < 0
            assert not np.asarray(out)[padding].any()  # padding queries read zeros


@pytest.mark.parametrize("key_layout", ["hd_page", "page_hd"])
def test_writes_land_in_their_pages_and_padding_is_dropped(key_layout):
    scene = make_scene(1, [2, 6], [3, 1], key_layout)
    _, k_pool, v_pool = _run(scene, -(-items_needed(scene["total"], PAGE) // 8) * 8)
    for row, total in enumerate(scene["total"]):
        for s in range(total):
            page, off = scene["held"][row][s // PAGE], s % PAGE
            key = (np.asarray(k_pool)[page, :, :, off] if key_layout == "hd_page"
                   else np.asarray(k_pool)[page, :, off])
            np.testing.assert_allclose(key, scene["keys"][row][s], rtol=1e-6)
            np.testing.assert_allclose(np.asarray(v_pool)[page, :, off],
                                       scene["values"][row][s], rtol=1e-6)
    untouched = set(range(scene["k_pool"].shape[0])) - {p for h in scene["held"] for p in h}
    assert not np.asarray(k_pool)[sorted(untouched)].any()


def test_a_row_is_bitwise_independent_of_the_other_rows_and_the_padding():
    """The engine's deterministic mode relies on it (for a fixed row count): the same row
    alone (the other rows padding), among other rows (at another position of the item
    list, across a tile boundary) and with more padding items (before the tiled merge,
    16 and 32 items differed in the last bit)."""
    scene = make_scene(2, [5, 11, 2], [1, 1, 1])
    crowd, _, _ = _run(scene, 16)
    padded, _, _ = _run(scene, 32)
    alone_scene = dict(scene, held=[[], scene["held"][1], []], total=[0, scene["total"][1], 0])
    for name in ("slots", "write"):
        alone_scene[name] = np.where(np.arange(3)[:, None] == 1, scene[name], -1)
    alone, _, _ = _run(alone_scene, 8)
    assert np.array_equal(np.asarray(crowd)[1], np.asarray(alone)[1])
    assert np.array_equal(np.asarray(padded), np.asarray(crowd))


def test_copy_pages_and_bad_work_lists():
    config = ModelConfig(arch="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8)
    cache = init_paged_cache(config, num_pages=5, page_size=PAGE)
    assert cache.num_pages == 5 and cache.page_size == PAGE
    assert page_bytes(config, PAGE, jnp.float32) == 2 * 2 * 1 * 8 * PAGE * 4
    filled = type(cache)(k=tuple(x.at[1].set(1.0) for x in cache.k),
                         v=tuple(x.at[1].set(2.0) for x in cache.v))
    copied = filled.copy_pages(jnp.array([1, 1]), jnp.array([3, 99]))  # 99: dropped
    assert np.asarray(copied.k[0])[3].min() == 1.0 and np.asarray(copied.v[1])[3].min() == 2.0
    assert not np.asarray(copied.k[0])[[0, 2, 4]].any()
    with pytest.raises(ValueError, match="holds 1 pages"):
        build_items([[0]], [PAGE + 1], 1, PAGE, 8)
    with pytest.raises(ValueError, match="do not fit"):
        build_items([[0, 1], [2]], [PAGE + 1, 1], 2, PAGE, 2)
    with pytest.raises(ValueError, match="positive"):
        init_paged_cache(config, num_pages=0, page_size=PAGE)
    with pytest.raises(ValueError, match="key_layout must be one of"):
        init_paged_cache(config, num_pages=5, page_size=PAGE, key_layout="page_major")
    scene = make_scene(3, [1], [1])
    with pytest.raises(ValueError, match="not a multiple of 4"):
        _run(scene, 6)


def _run_view(scene, size, dtype=jnp.float32, jit=True, page_size=PAGE):
    """What a decode step does: the rows' pages gathered into a view (items without tile
    padding), the new tokens written into the view, attention over it."""
    items = build_items(scene["held"], scene["total"], len(scene["held"]), page_size, size,
                        tile=1)
    items = AttentionItems(*(jnp.asarray(x) for x in (items.row, items.page,
                                                      items.first_slot)))
    layout = scene["key_layout"]

    def call(q, k_pool, v_pool, new_k, new_v, slots):
        view = gather_view(PagedKVCache(k=(k_pool,), v=(v_pool,), key_layout=layout), items)
        view_items = ViewItems.of(items, slots.shape[0])
        at = view_index(view_items, slots, page_size)
        k_view, v_view = write_pages(view.k[0], view.v[0], new_k, new_v, at, layout)
        return view_attention(q, k_view, v_view, slots, view_items, layout)

    call = jax.jit(call) if jit else call
    args = [jnp.asarray(scene[n], dtype) for n in ("q", "k_pool", "v_pool", "new_k", "new_v")]
    return call(*args, jnp.asarray(scene["slots"]))


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("key_layout", ["hd_page", "page_hd"])
def test_view_attention_matches_the_float64_reference(jit, key_layout):
    with jax.enable_x64():
        # decode steps over 0 to 9 pages a row (tree merges of up to 4 levels) and 33
        # pages beside 1 and 2 (6 levels); a padding row; and a chunk of new tokens (the
        # function takes any T)
        for lengths, new in [([3, 12, 0, 7, 33], [1, 1, 1, 1, 1]),
                             ([130, 2, 5], [1, 1, 1]),
                             ([3, 0, 9], [1, 0, 1]),
                             ([0, 5, 9], [7, 3, 1])]:
            scene = make_scene(4, lengths, new, key_layout)
            size = items_needed(scene["total"], PAGE, tile=1) + 3  # padding items too
            out = _run_view(scene, size, jnp.float64, jit)
            expected = reference(scene["q"], scene["keys"], scene["values"], lengths,
                                 scene["slots"])
            np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)
            assert not np.asarray(out)[scene["slots"] < 0].any()


def test_view_attention_rows_are_bitwise_independent_of_the_batch():
    """A row's result alone (the other rows padding), in a crowd of rows with more and
    fewer pages (so more tree levels run: no-ops for it) and with more padding items.
    (XLA:CPU's plain sum over a page differed in the last bit between item counts.)"""
    page = 64
    lengths = [80, 200, 500, 2, 2000]
    scene = make_scene(5, lengths, [1] * 5, page_size=page)
    run = functools.partial(_run_view, page_size=page)
    need = items_needed(scene["total"], page, tile=1)
    crowd = np.asarray(run(scene, need))
    padded = np.asarray(run(scene, 64))
    assert np.array_equal(padded, crowd)
    for row in range(len(lengths)):
        alone = dict(scene, held=[h if r == row else [] for r, h in enumerate(scene["held"])],
                     total=[t if r == row else 0 for r, t in enumerate(scene["total"])])
        for name in ("slots", "write"):
            alone[name] = np.where(np.arange(len(lengths))[:, None] == row, scene[name], -1)
        out = np.asarray(run(alone, items_needed(alone["total"], page, tile=1)))
        assert np.array_equal(out[row], crowd[row]), row


@pytest.mark.parametrize("key_layout", ["hd_page", "page_hd"])
def test_copy_slots_reads_what_write_pages_wrote(key_layout):
    scene = make_scene(6, [2, 6], [3, 1], key_layout)
    k_pool, v_pool = write_pages(*(jnp.asarray(scene[n]) for n in
                                   ("k_pool", "v_pool", "new_k", "new_v")),
                                 jnp.asarray(scene["write"]), key_layout)
    k, v = read_slots(k_pool, v_pool, jnp.asarray(scene["write"]), key_layout)
    written = scene["write"] >= 0
    np.testing.assert_array_equal(np.asarray(k)[written], scene["new_k"][written].astype(np.float32))
    np.testing.assert_array_equal(np.asarray(v)[written], scene["new_v"][written].astype(np.float32))
    # copied into an empty pool of the other layout, at other slots; -1 copies nothing
    other = "page_hd" if key_layout == "hd_page" else "hd_page"
    src = PagedKVCache(k=(k_pool,), v=(v_pool,), key_layout=key_layout)
    dst = init_paged_cache(ModelConfig(arch="qwen2", vocab_size=8, hidden_size=8,
                                       intermediate_size=8, num_layers=1, num_heads=K * G,
                                       num_kv_heads=K, head_dim=HD, dtype=jnp.float32),
                           num_pages=4, page_size=PAGE, key_layout=other)
    target = np.where(written, np.arange(scene["write"].size).reshape(scene["write"].shape),
                      -1).astype(np.int32)
    dst = copy_slots(src, jnp.asarray(scene["write"]), dst, jnp.asarray(target))
    k2, v2 = read_slots(dst.k[0], dst.v[0], jnp.asarray(target), other)
    np.testing.assert_array_equal(np.asarray(k2)[written], np.asarray(k)[written])
    np.testing.assert_array_equal(np.asarray(v2)[written], np.asarray(v)[written])
    filled = {int(i) for i in target[written]}
    untouched = [i for i in range(4 * PAGE) if i not in filled]
    assert not np.asarray(read_slots(dst.k[0], dst.v[0], jnp.asarray([untouched]), other)[0]).any()


def test_ordered_sum_is_the_sum_whatever_the_leading_shape():
    rng = np.random.default_rng(7)
    for width in (1, 3, 4, 64, 100):
        x = rng.standard_normal((37, width)).astype(np.float32)
        total = np.asarray(jax.jit(_ordered_sum)(x))
        np.testing.assert_allclose(total, x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-5)
        for rows in (1, 2, 5, 36):
            assert np.array_equal(np.asarray(jax.jit(_ordered_sum)(x[:rows])), total[:rows])


def test_items_without_tiles_for_the_view():
    host = build_items([[7, 3], [5], []], [PAGE + 1, 2, 0], 3, PAGE, 4, tile=1)
    assert host.row.tolist() == [0, 0, 1, 3] and host.page.tolist() == [7, 3, 5, 0]
    assert host.first_slot.tolist()[:3] == [0, PAGE, 0]
    assert items_needed([PAGE + 1, 2, 0], PAGE, tile=1) == 3
    assert items_needed([PAGE + 1, 2, 0], PAGE) == 8
