"""What the JaxEngine compiles: exactly the programs its shapes plan (by bucket), and
the compile budgets of scripts/serve.py's defaults, stated from that plan."""
import collections

import pytest

from agentjax.core import compiles
from agentjax.engine.jax.engine import JaxEngine
from agentjax.engine.jax.shapes import engine_shapes
from agentjax.engine.protocol import GenerateRequest, SamplingParams

# Shapes no other test uses, so this engine's programs compile here, in this process.
SHAPES = dict(max_slots=3, max_len=40, prefill_chunks=(8, 24), decode_steps=3, page_size=8,
              batch_buckets=(1,), eos_token_ids=())


def _planned(shapes) -> collections.Counter:
    """The compiles a warm-up of an engine with `shapes` makes: one per planned program
    (its bucket as the programs name it), and the page copy."""
    planned = collections.Counter(
        ("prefill", (("rows", rows), ("chunk", width), ("items", items))) if kind == "prefill"
        else ("decode", (("rows", rows), ("items", items), ("steps", SHAPES["decode_steps"])))
        for kind, rows, width, items in shapes.programs())
    planned["copy_pages", (("copies", SHAPES["max_slots"]),)] += 1
    return planned


def test_warmup_compiles_exactly_the_planned_programs(tiny_model):
    before = compiles.counts()
    with JaxEngine.from_model(tiny_model, **SHAPES) as engine:
        assert engine._shapes.programs() == engine_shapes(**SHAPES).programs()
        warmed = compiles.counts()
        programs = engine.warmup()
        compiled = compiles.since(warmed)
        # Rows 1 and 3 (max_slots) x chunks 8 and 24, one item count each (a row holds
        # at most 5 pages: 8 items in whole tiles); decode at 1 row 8 items, at 3 rows
        # 8 and 15 (the pool's 15 pages bound a call's view).
        assert programs == 4 + 3
        assert compiled == _planned(engine._shapes)
        # Building the engine compiled its weights copy (none when an engine built
        # earlier in this process compiled it), nothing per shape.
        assert compiles.by_function(compiles.since(before)).get("engine_weights", 0) <= 1
        # Requests of every size afterwards compile nothing more.
        engine.generate_sync([GenerateRequest(list(range(1, n)), SamplingParams(
            max_new_tokens=40 - n, seed=n)) for n in (2, 9, 30)])
        engine.generate_sync([GenerateRequest([5, 6], SamplingParams(max_new_tokens=4))])
        assert compiles.since(warmed) == compiled


# scripts/serve.py with its default flags (16 requests, pages of 64, chunks 16/64/256, 8
# decode steps, one lane, not deterministic) plans these programs for a model's context
# length; the budget is what the shapes need (engine/jax/shapes.py): prefill 3 row
# counts x 3 chunks, decode 3 row counts x the item counts of their rows' pages. At a
# 32k context that is 9 + 42 = 51 (123 when prefill had an item count per power of
# two; 36 before the paged cache, whose decode copied a span of a per-row cache).
SERVE_BUDGET = {2048: 28, 8192: 39, 32768: 51, 131072: 63}


@pytest.mark.parametrize("context_length", sorted(SERVE_BUDGET))
def test_serve_defaults_stay_within_their_compile_budget(context_length, tmp_path):
    from agentjax.sglang.server.main import engine_settings, parse_args

    (tmp_path / "config.json").write_text("{}")
    args = parse_args(["--model-path", str(tmp_path)])
    settings = engine_settings(args, context_length)
    shapes = engine_shapes(**dict(settings, max_slots=settings["max_slots"] // args.lanes))
    assert len(shapes.programs()) <= SERVE_BUDGET[context_length]
