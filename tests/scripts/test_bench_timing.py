"""scripts/bench/timing.py: interleaved order, best of runs and spread, and the rule that
refuses a ratio smaller than the noise. Hand-computed values; nothing depends on timing."""
import os
import runpy

import pytest

from tests.scripts.test_train import ROOT

timing = runpy.run_path(os.path.join(ROOT, "scripts", "bench", "timing.py"))
Runs, Ratio, measure = timing["Runs"], timing["Ratio"], timing["measure"]


def test_repeats_take_turns_each_round_starting_one_candidate_later():
    assert timing["interleaved"](["base", "case"], 3) == [
        "base", "case", "case", "base", "base", "case"]
    assert timing["interleaved"](["a", "b", "c"], 4) == [
        "a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert timing["interleaved"](["a", "b", "c"], 1) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        timing["interleaved"](["a"], 0)


def test_measure_warms_every_candidate_then_interleaves_its_runs():
    calls = []

    def candidate(name):
        def run():
            calls.append(name)
            return len(calls)
        return run

    results = measure({"a": candidate("a"), "b": candidate("b")}, 2)
    # Warm-up a, b (calls 1-2, untimed), then a b b a: calls 3-6.
    assert calls == ["a", "b", "a", "b", "b", "a"]
    assert results == {"a": [3, 6], "b": [4, 5]}
    calls.clear()
    assert measure({"a": candidate("a")}, 2, warmup=False) == {"a": [1, 2]}


def test_a_compilation_inside_a_timed_run_is_an_error_warm_up_compiles_are_not():
    compiled = {"prefill": 0}

    def compiles_on_its_first_two_calls():
        compiled["prefill"] = min(compiled["prefill"] + 1, 2)

    # The warm-up call compiles once (allowed), the first timed call once more.
    with pytest.raises(timing["CompiledWhileTimed"],
                       match=r"timed run of 'a' compiled \(counters \{'prefill': 1\} -> "
                             r"\{'prefill': 2\}\)"):
        measure({"a": compiles_on_its_first_two_calls}, 3,
                compilations=lambda: dict(compiled))
    compiled["prefill"] = 0
    assert measure({"b": lambda: compiled.update(prefill=1)}, 2,
                   compilations=lambda: dict(compiled)) == {"b": [None, None]}


def test_best_is_the_minimum_and_spread_is_max_minus_min_over_min():
    runs = Runs((2.5, 2.0, 3.0))
    assert runs.best == 2.0
    assert runs.spread == pytest.approx(0.5)  # (3.0 - 2.0) / 2.0
    assert runs.spread_text() == "50%"
    assert Runs((1.0, 1.02)).spread_text() == "2.0%"
    single = Runs((4.0,))
    assert single.best == 4.0 and single.spread is None and single.spread_text() == "one run"
    # Per unit of work: 10 s / 100 tokens, 12 s / 100 tokens, 9 s / 90 tokens.
    per_token = Runs((10.0, 12.0, 9.0)).per([100, 100, 90])
    assert per_token.costs == pytest.approx((0.1, 0.12, 0.1))
    assert per_token.spread == pytest.approx(0.2)
    with pytest.raises(ValueError, match="2 unit counts for 3 runs"):
        Runs((1.0, 2.0, 3.0)).per([1, 2])
    with pytest.raises(ValueError, match="positive costs"):
        Runs(())
    with pytest.raises(ValueError, match="positive costs"):
        Runs((1.0, 0.0))


def test_a_ratio_is_printed_only_when_its_effect_exceeds_both_spreads():
    # Baseline best 4.0 s (runs 4.0, 5.0: spread 25%), case best 5.0 s (runs 5.5, 5.0:
    # spread 10%): the case takes 1.25x the time, an effect of 25%, not above 25%.
    base, case = Runs((4.0, 5.0)), Runs((5.5, 5.0))
    ratio = Ratio.of(case, base)
    assert (ratio.value, ratio.effect, ratio.spread) == (1.25, 0.25, 0.25)
    assert not ratio.resolved
    assert ratio.text() == "unresolved: spread 25% >= effect 25%"
    # Baseline runs 4.5 and 4.0 (spread 12.5%): the 25% effect is resolved.
    resolved = Ratio.of(case, Runs((4.5, 4.0)))
    assert (resolved.spread, resolved.resolved, resolved.text()) == (0.125, True, "1.25x")
    # The effect is symmetric: 4.0 / 5.0 = 0.8x is also a 25% effect.
    inverse = Ratio.of(Runs((4.5, 4.0)), case)
    assert inverse.value == pytest.approx(0.8) and inverse.effect == pytest.approx(0.25)
    assert inverse.text() == "0.80x" and inverse.text(digits=3) == "0.800x"


def test_the_polluted_pool_table_is_refused():
    # The table this rule was written for: zero latency 17.67 s, 100 ms latency 7.63 s,
    # printed as "2.32x". Had the zero-latency runs been 17.67 and 7.2 s (a 145% spread,
    # best 7.2 s), the best-of ratio 7.2 / 7.63 = 0.944 is refused.
    ratio = Ratio.of(Runs((17.67, 7.2)), Runs((7.63, 7.7)))
    assert ratio.value == pytest.approx(7.2 / 7.63)
    assert ratio.effect == pytest.approx(7.63 / 7.2 - 1)
    assert ratio.spread == pytest.approx((17.67 - 7.2) / 7.2)
    assert ratio.text() == "unresolved: spread 145% >= effect 6.0%"


def test_one_run_has_no_spread_so_its_ratio_is_unresolved():
    ratio = Ratio.of(Runs((1.0,)), Runs((2.0, 2.0)))
    assert ratio.value == 0.5 and ratio.effect == pytest.approx(1.0)
    assert ratio.spread is None and not ratio.resolved
    assert ratio.text() == "unresolved: one run, no spread (effect 100%)"
