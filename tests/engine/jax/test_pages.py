"""PageTable: pages with reference counts, parked sessions, shared prompts,
copy-on-write and reclaiming (no JAX)."""
import ast
import collections
import dataclasses
import inspect
from typing import Any

import pytest

from agentjax.engine.jax import pages as pages_module
from agentjax.engine.jax.pages import PageTable, common_prefix

PAGE = 4


@dataclasses.dataclass(eq=False)
class Seq:
    input_ids: tuple[int, ...]
    session_id: str | None = None
    outputs: list[int] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)
    length: int = 0
    segments: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def _table(num_pages=8, evict_parked=True):
    return PageTable(num_pages, PAGE, evict_parked=evict_parked, stats=collections.Counter())


def _prefill(table, seq):
    """What the engine does: writes the context but its last id, then reports it."""
    assert table.prepare_writes(seq, len(seq.input_ids) - 1) is not None
    seq.length = len(seq.input_ids) - 1
    table.prefilled(seq)


def _finish(table, seq, outputs):
    """The engine's end of a sequence: every id but the last output is cached."""
    assert table.prepare_writes(seq, len(seq.input_ids) + len(outputs) - 1) is not None
    seq.outputs = list(outputs)
    seq.length = len(seq.input_ids) + len(outputs) - 1
    table.release(seq)


def test_the_table_imports_no_jax():
    tree = ast.parse(inspect.getsource(pages_module))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in ("jax", "flax", "agentjax")}


@pytest.mark.parametrize("a,b,expected", [
    ((), (1, 2), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2), 2), ((1, 2), (1, 2, 3), 2),
    ((1, 9, 3), (1, 2, 3), 1), ((4,), (5,), 0),
])
def test_common_prefix(a, b, expected):
    assert common_prefix(a, b) == expected


def test_pages_follow_the_tokens_held_and_free_on_release():
    table = _table()
    seq = Seq(tuple(range(10)))  # 9 slots to prefill + 2 decode steps: 3 pages
    assert table.admit(seq, decode_steps=2) and table.in_use == 3
    _prefill(table, seq)
    # 14 slots: 4 pages, and a copy of the third, which the prompt shares (slot 8).
    _finish(table, seq, [50, 51, 52, 53, 54])
    assert table.peak_in_use == 5 and seq.pages == []
    assert table.in_use == 3  # the prompt stays shared (its 9 slots) until reclaimed
    table.drop_cached()
    assert table.in_use == 0
    big = Seq(tuple(range(40)))  # 10 pages > 8
    assert not table.admit(big, decode_steps=1) and big.pages == [] and table.in_use == 0


def test_a_session_keeps_its_pages_and_reuses_the_common_prefix():
    table = _table()
    first = Seq((1, 2, 3, 4, 5, 6), session_id="s")
    assert table.admit(first, 1)
    _prefill(table, first)
    _finish(table, first, [7, 8])  # cached: 1..7 (the last output, 8, is never fed)
    session = table.sessions["s"]
    assert session.cached_ids == [1, 2, 3, 4, 5, 6, 7] and len(session.pages) == 2
    again = Seq((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), session_id="s")
    assert table.admit(again, 1)
    assert again.meta["cached_tokens"] == 7 and not again.meta["prefix_mismatch"]
    assert again.length == 7 and session.pages == [] and table.sessions["s"].busy
    table.release(again)
    # A history that diverges at id 3 keeps only the first page's first 2 slots.
    edited = Seq((1, 2, 99, 4, 5), session_id="s")
    assert table.admit(edited, 1)
    assert edited.meta["cached_tokens"] == 2 and edited.meta["prefix_mismatch"]
    assert len(edited.pages) == 2  # 4 slots + 1 step
    assert table.in_use == 3  # + the first turn's shared prompt (slots 0-4)


def test_one_request_per_session_and_end_session():
    table = _table()
    a, b = Seq((1, 2, 3), session_id="s"), Seq((1, 2, 3, 4), session_id="s")
    assert table.admit(a, 1) and not table.admit(b, 1)
    table.end_session("s")  # busy: ends on release
    _finish(table, a, [9])
    assert "s" not in table.sessions and table.in_use == 0
    c = Seq((1, 2, 3), session_id="t")
    assert table.admit(c, 1)
    _finish(table, c, [9])
    assert table.in_use == 1
    table.end_session("t")
    assert table.in_use == 0 and not table.sessions


def test_a_shared_prompt_is_prefilled_once_and_copied_on_write():
    table = _table()
    prompt = tuple(range(1, 8))  # 6 slots to prefill: pages 0 (full) and 1 (half)
    leader, sibling = Seq(prompt), Seq(prompt)
    assert table.admit(leader, 1)
    assert not table.admit(sibling, 1)  # the leader is still prefilling it
    _prefill(table, leader)
    assert table.admit(sibling, 1)
    assert sibling.meta["shared_prefix"] and sibling.length == 6
    assert sibling.pages == leader.pages and table.stats["shared_prefixes"] == 1
    shared = list(leader.pages)
    # Each writes its first decoded slot (6) into the half page: a copy each (the
    # shared prompt keeps the original); the full page stays shared.
    leader_copies = table.prepare_writes(leader, 7)
    sibling_copies = table.prepare_writes(sibling, 7)
    assert [src for src, _ in leader_copies + sibling_copies] == [shared[1], shared[1]]
    assert leader.pages[0] == sibling.pages[0] == shared[0]
    assert len({leader.pages[1], sibling.pages[1], shared[1]}) == 3
    assert table.refs[shared[0]] == 3 and table.refs[shared[1]] == 1
    # The original half page only the shared prompt references: in use, not held.
    assert table.in_use == 4 and table.held == 3
    for seq in (leader, sibling):
        table.release(seq)
    assert table.in_use == 2 and table.held == 0  # the shared prompt's two pages, a cache
    table.drop_cached()
    assert table.in_use == 0 and not table.contexts and not table.context_refs.any()


def test_a_cancelled_leader_lets_its_sibling_prefill_alone():
    table = _table()
    leader, sibling = Seq((1, 2, 3, 4, 5)), Seq((1, 2, 3, 4, 5))
    assert table.admit(leader, 1) and not table.admit(sibling, 1)
    table.release(leader)
    assert table.admit(sibling, 1) and sibling.length == 0
    assert "shared_prefix" not in sibling.meta


def test_reclaiming_drops_shared_prompts_then_the_least_recently_parked_session():
    table = _table(num_pages=6)
    for name, ids in (("old", (1, 2, 3, 4, 5)), ("new", (6, 7, 8, 9, 10))):
        seq = Seq(ids, session_id=name)
        assert table.admit(seq, 1)
        _prefill(table, seq)
        _finish(table, seq, [11, 12, 13, 14])  # 8 slots: 2 pages each
    assert table.in_use == 4 and len(table.contexts) == 2  # the prompts share their pages
    assert table.held == 4  # the parked sessions hold them too
    stranger = Seq(tuple(range(20, 29)))  # 8 slots + 1 step: 3 pages
    assert table.admit(stranger, 1)
    assert not table.contexts and table.stats["evictions"] == 1
    assert table.held == table.in_use == 5 and not table.context_refs.any()
    assert table.sessions["old"].pages == [] and table.sessions["new"].pages
    table.release(stranger)
    back = Seq((1, 2, 3, 4, 5, 11), session_id="old")
    assert table.admit(back, 1) and back.meta["reprefilled"] and back.length == 0


def test_reclaiming_keeps_a_context_whose_pages_are_still_held():
    """A group's prompt, registered first (least recently used), while a sample still
    holds its pages: dropping it frees nothing, so a newer context that frees its pages
    goes instead, and a late sibling still shares the prompt."""
    table = _table(num_pages=7)
    prompt = (1, 2, 3, 4, 5)  # 4 slots prefilled: one page, plus one for the decode step
    sample = Seq(prompt)
    assert table.admit(sample, 1)
    _prefill(table, sample)
    other = Seq((6, 7, 8, 9, 10))
    assert table.admit(other, 1)
    _prefill(table, other)
    table.release(other)  # its context's page: only the cache holds it now
    assert list(table.contexts) == [(prompt[:4], ((0, 4),)), ((6, 7, 8, 9), ((0, 4),))]
    assert table.free == 4 and table.held == 2
    stranger = Seq(tuple(range(20, 40)))  # 19 slots + 1 step: 5 pages
    assert table.admit(stranger, 1)
    assert list(table.contexts) == [(prompt[:4], ((0, 4),))]
    assert table.stats["contexts_reclaimed"] == 1
    sibling = Seq(prompt)
    table.release(stranger)
    assert table.admit(sibling, 1) and sibling.meta["shared_prefix"]


def test_without_eviction_parked_sessions_keep_their_pages():
    table = _table(num_pages=4, evict_parked=False)
    seq = Seq((1, 2, 3, 4, 5, 6), session_id="s")
    assert table.admit(seq, 1)
    _finish(table, seq, [7, 8, 9])  # 8 slots: 2 pages
    table.contexts.clear()
    stranger = Seq(tuple(range(20, 29)))
    assert not table.admit(stranger, 1)
    assert table.stats["evictions"] == 0 and len(table.sessions["s"].pages) == 2
    assert table.in_use == 2


def test_a_refused_session_request_keeps_what_it_shares():
    table = _table(num_pages=3, evict_parked=False)
    seq = Seq((1, 2, 3, 4, 5, 6), session_id="s")
    assert table.admit(seq, 1)
    _finish(table, seq, [7])  # 6 slots: 2 pages
    longer = Seq((1, 2, 3, 9) + tuple(range(20, 30)), session_id="s")  # needs 4 pages
    assert not table.admit(longer, 1)
    session = table.sessions["s"]
    assert session.cached_ids == [1, 2, 3] and len(session.pages) == 1
    assert not session.busy and table.in_use == 1


def test_clear_frees_everything():
    table = _table()
    seq = Seq((1, 2, 3, 4), session_id="s")
    assert table.admit(seq, 4)
    table.clear()
    assert table.in_use == 0 and table.free == 8 and not table.sessions


def _first_turn(table, session_id, prompt, outputs):
    seq = Seq(tuple(prompt), session_id=session_id)
    assert table.admit(seq, 1)
    if not seq.meta.get("shared_prefix"):
        _prefill(table, seq)
    _finish(table, seq, outputs)
    return seq


def test_a_later_turn_reached_alike_is_prefilled_once():
    """Two sessions that sampled the same action and saw the same observation: the
    second shares the first's whole context (its own pages of the first turn go back
    to the pool) and prefills nothing."""
    table = _table(num_pages=16)
    prompt, action, observation = (1, 2, 3, 4, 5, 6), [7, 8], (9, 10, 11)
    for name in ("a", "b"):
        _first_turn(table, name, prompt, action)  # cached: 7 slots, prefilled [0, 5)
    ids = prompt + tuple(action) + observation  # 10 slots: 7 cached, [7, 10) prefilled
    a, b = Seq(ids, session_id="a"), Seq(ids, session_id="b")
    assert table.admit(a, 1) and a.length == 7 and a.segments == [(0, 5), (7, 10)]
    assert not table.admit(b, 1)  # a prefills it: b waits, its session parked as it was
    assert table.sessions["b"].pages and not table.sessions["b"].busy
    _prefill(table, a)
    in_use = table.in_use
    assert table.admit(b, 1)
    assert b.meta["shared_prefix"] and b.meta["cached_tokens"] == 10 and b.length == 10
    assert b.pages[:3] == a.pages[:3] and b.segments == a.segments
    # b's first turn held the prompt's first page and its own copy of the second: the
    # copy is freed. Its decode step (slot 10) lands in the shared third page, which it
    # copies when it writes there.
    assert table.in_use == in_use - 1 and table.writes_need(b, 11) == 1
    assert table.stats["shared_prefixes"] == 2  # the first turn's prompt, this context
    _finish(table, a, [12])
    _finish(table, b, [12])
    assert table.sessions["b"].segments == [(0, 5), (7, 10)]


def test_the_same_ids_computed_another_way_are_not_shared():
    """c prefilled the first action token with its prompt; a decoded it. Their next
    contexts have the same ids, but their cached slots came from other programs, which
    deterministic mode tells apart: c prefills its own."""
    table = _table(num_pages=16)
    _first_turn(table, "a", (1, 2, 3, 4, 5, 6), [7, 8])       # prefilled [0, 5)
    _first_turn(table, "c", (1, 2, 3, 4, 5, 6, 7), [8])       # prefilled [0, 6)
    assert table.sessions["a"].cached_ids == table.sessions["c"].cached_ids
    ids = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    a, c, fresh = Seq(ids, session_id="a"), Seq(ids, session_id="c"), Seq(ids)
    assert table.admit(a, 1)
    _prefill(table, a)
    assert table.admit(c, 1) and "shared_prefix" not in c.meta and c.length == 7
    assert c.segments == [(0, 6), (7, 10)]
    _prefill(table, c)
    assert table.admit(fresh, 1) and fresh.length == 0 and fresh.segments == [(0, 10)]
    _prefill(table, fresh)
    again = Seq(ids)
    assert table.admit(again, 1) and again.meta["shared_prefix"]
    assert again.pages[:3] == fresh.pages[:3]


def test_a_session_keeps_its_pages_when_a_shared_context_does_not_fit():
    table = _table(num_pages=6, evict_parked=False)
    _first_turn(table, "a", (1, 2, 3, 4, 5, 6), [7, 8])
    _first_turn(table, "b", (1, 2, 3, 4, 5, 6), [7, 8])
    ids = (1, 2, 3, 4, 5, 6, 7) + tuple(range(20, 28))  # 14 slots + 4 steps: 5 pages
    a = Seq(ids, session_id="a")
    assert table.admit(a, 4)
    _prefill(table, a)
    b = Seq(ids, session_id="b")
    held = list(table.sessions["b"].pages)
    assert not table.admit(b, 4) and b.pages == [] and b.length == 0
    assert table.sessions["b"].pages == held and not table.sessions["b"].busy


def test_recompute_prefills_the_context_so_far_from_slot_zero():
    table = _table()
    seq = Seq((1, 2, 3, 4, 5), session_id="s")
    assert table.admit(seq, 1)
    assert seq.segments == [(0, 4)] and table.prefilling
    seq.outputs = [6, 7]
    table.recompute(seq)
    assert seq.length == 0 and seq.segments == [(0, 6)] and not table.prefilling
