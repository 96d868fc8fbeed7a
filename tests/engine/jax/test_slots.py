"""SlotTable: cache rows, parked sessions, common prefixes and eviction (no JAX)."""
import ast
import collections
import dataclasses
import inspect
from typing import Any

import pytest

from agentjax.engine.jax import slots
from agentjax.engine.jax.slots import SlotTable, common_prefix


@dataclasses.dataclass(eq=False)
class Seq:
    input_ids: tuple[int, ...]
    session_id: str | None = None
    outputs: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def _table(rows=2, evict_parked=True):
    return SlotTable(rows, evict_parked=evict_parked, stats=collections.Counter())


def _finish(table, seq, outputs):
    """What the engine does when a sequence ends: the cache holds every id but the last
    output (never fed)."""
    seq.outputs = list(outputs)
    table.lengths[seq.slot] = len(seq.input_ids) + len(seq.outputs) - 1
    table.release(seq)


def test_the_table_imports_no_jax():
    tree = ast.parse(inspect.getsource(slots))
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


def test_admits_into_free_rows_until_full_and_frees_on_release():
    table = _table(rows=2)
    a, b, c = Seq((1, 2, 3)), Seq((4, 5)), Seq((6,))
    assert list(table.admit([a, b, c])) == [c]
    assert (a.slot, b.slot) == (0, 1) and table.in_flight() == [a, b]
    assert a.prefilled == 0 and a.meta == {"cached_tokens": 0}
    assert list(table.lengths) == [0, 0]
    _finish(table, a, [7])
    assert a.slot is None and table.rows == [None, b] and table.in_flight() == [b]
    assert not table.admit([c]) and c.slot == 0


def test_a_session_parks_its_row_and_reuses_the_common_prefix():
    table = _table(rows=2)
    turn1 = Seq((1, 2, 3), session_id="s")
    table.admit([turn1])
    _finish(table, turn1, [4, 5])  # cached: 1 2 3 4 (5 sampled, never fed)
    assert table.rows[0] == "s" and table.sessions["s"].cached_ids == [1, 2, 3, 4]
    assert table.in_flight() == []
    turn2 = Seq((1, 2, 3, 4, 5, 6, 7), session_id="s")
    assert not table.admit([turn2])
    assert turn2.slot == 0 and turn2.prefilled == 4 and table.lengths[0] == 4
    assert turn2.meta == {"prefix_mismatch": False, "cached_tokens": 4}
    assert table.sessions["s"].busy


def test_a_diverging_request_reuses_only_the_shared_prefix():
    table = _table(rows=1)
    first = Seq((1, 2, 3, 4), session_id="s")
    table.admit([first])
    _finish(table, first, [5, 6])
    edited = Seq((1, 2, 9, 9, 9), session_id="s")
    table.admit([edited])
    assert edited.prefilled == 2
    assert edited.meta == {"prefix_mismatch": True, "cached_tokens": 2}


def test_at_least_one_token_is_prefilled_when_everything_is_cached():
    table = _table(rows=1)
    first = Seq((1, 2, 3), session_id="s")
    table.admit([first])
    _finish(table, first, [4, 5])
    again = Seq((1, 2, 3), session_id="s")  # fully cached: its last token gives the sample
    table.admit([again])
    assert again.prefilled == 2 and again.meta["cached_tokens"] == 2


def test_one_request_per_session_at_a_time():
    table = _table(rows=2)
    first, second = Seq((1,), session_id="s"), Seq((1, 2), session_id="s")
    assert list(table.admit([first, second])) == [second]
    assert second.slot is None
    _finish(table, first, [2])
    assert not table.admit([second]) and second.slot == table.sessions["s"].slot == 0


def test_sessions_holding_a_row_are_admitted_first():
    table = _table(rows=2, evict_parked=False)
    parked = Seq((1, 2), session_id="s")
    table.admit([parked])
    _finish(table, parked, [3])
    other, filler = Seq((7,)), Seq((8,))
    table.admit([filler])  # row 1 taken: only the parked row is left
    returning = Seq((1, 2, 3, 4), session_id="s")
    assert list(table.admit([other, returning])) == [other]
    assert returning.slot == 0


def test_end_session_frees_a_parked_row_and_waits_for_a_busy_one():
    table = _table(rows=2)
    parked = Seq((1,), session_id="parked")
    table.admit([parked])
    _finish(table, parked, [2])
    table.end_session("parked")
    assert table.rows[0] is None and "parked" not in table.sessions
    busy = Seq((1,), session_id="busy")
    table.admit([busy])
    table.end_session("busy")
    assert table.rows[busy.slot] is busy and table.sessions["busy"].ended
    slot = busy.slot
    _finish(table, busy, [2])
    assert table.rows[slot] is None and "busy" not in table.sessions
    table.end_session("unknown")  # no-op


def test_eviction_takes_the_least_recently_released_session():
    table = _table(rows=2)
    for name, ids in (("old", (1,)), ("new", (2,))):
        seq = Seq(ids, session_id=name)
        table.admit([seq])
        _finish(table, seq, [3])
    assert table.rows == ["old", "new"]
    stranger = Seq((9,))
    assert not table.admit([stranger])
    assert stranger.slot == 0 and table.stats["evictions"] == 1
    assert table.sessions["old"].slot is None and table.sessions["old"].cached_ids == []
    back = Seq((1, 3, 4), session_id="old")  # its row is gone: prefilled from scratch
    _finish(table, stranger, [5])
    table.admit([back])
    assert back.prefilled == 0 and back.meta == {"reprefilled": True, "cached_tokens": 0}
    assert table.rows[1] == "new"


def test_without_eviction_parked_sessions_keep_their_rows():
    table = _table(rows=1, evict_parked=False)
    seq = Seq((1,), session_id="s")
    table.admit([seq])
    _finish(table, seq, [2])
    stranger = Seq((5,))
    assert list(table.admit([stranger])) == [stranger]
    assert table.rows == ["s"] and table.stats["evictions"] == 0


def test_end_idle_sessions_keeps_busy_ones_and_clear_empties_everything():
    table = _table(rows=2)
    idle, busy = Seq((1,), session_id="idle"), Seq((2,), session_id="busy")
    table.admit([idle, busy])
    _finish(table, idle, [3])
    table.end_idle_sessions()
    assert list(table.sessions) == ["busy"] and table.rows == [None, busy]
    table.lengths[1] = 5
    table.clear()
    assert table.rows == [None, None] and table.sessions == {} and list(table.lengths) == [0, 0]
