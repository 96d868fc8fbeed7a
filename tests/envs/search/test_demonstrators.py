import collections
import dataclasses
import re

import numpy as np
import pytest

from agentjax.envs.search import demonstrators as demo_lib
from agentjax.envs.search.demonstrators import DemonstratorConfig, ScriptedSearcher, answer_action
from agentjax.envs.search.hindsight import relabel
from agentjax.rewards.outcome import episode_answer, exact_match
from agentjax.rewards.tools import tool_call_counts
from agentjax.envs.search.world import World, WorldConfig, parse_question
from agentjax.envs.retrieval import BM25Retriever
from agentjax.envs.search.env import SHORT_INSTRUCTION, SearchEnv
from tests.envs.search.worlds import env, world

_ACTION = re.compile(r"<(search|answer)> [^<>]+ </\1>")


def _run(config, tasks, max_turns=5, seed=0):
    w = world()
    searcher = ScriptedSearcher(config, demo_lib.guess_pool(w.train_tasks))
    return demo_lib.run_demonstrations(searcher, env(max_turns=max_turns), tasks, seed=seed)


def test_gold_scores_one_through_real_bm25_and_copies_observations():
    w = world()
    demos = _run(DemonstratorConfig(), w.test_tasks + w.train_tasks[:40])
    report = demo_lib.success_report(demos)
    assert report.success == 1.0 and set(report.by_hops) == {1, 2, 3, 4}
    for d in demos:
        hops = d.task.metadata["hops"]
        assert d.reward == 1.0 and len(d.turns) == hops + 1
        assert all(t.trainable and _ACTION.fullmatch(t.action) for t in d.turns)
        # Queries name the start and each bridge entity; the answer names the answer.
        chain = d.task.metadata["chain"]
        assert [t.action for t in d.turns] == (
            [f"<search> {h['subject']} </search>" for h in chain]
            + [f"<answer> {d.task.answers[0]} </answer>"])
        # Observations are exactly the env's, turn by turn; None once the episode ended.
        assert [t.observation for t in d.turns[:-1]] == [t.observation for t in d.log.turns[:-1]]
        assert d.turns[-1].observation is None and d.log.turns[-1].observation == ""
        assert d.messages[0]["content"].endswith(d.task.question + "\n")


def test_closed_book_guessing_is_near_zero():
    # The default-size world: the small test world has too few countries for flat priors.
    w = world(WorldConfig())
    searcher = ScriptedSearcher(DemonstratorConfig("closed", p_guess=1.0),
                                demo_lib.guess_pool(w.train_tasks))
    demos = demo_lib.run_demonstrations(searcher, env(WorldConfig()), w.test_tasks)
    assert all(len(d.turns) == 1 and d.turns[0].action.startswith("<answer>") for d in demos)
    assert demo_lib.success_report(demos).success < 0.05


def test_mode_guess_is_the_most_frequent_answer_of_the_relation():
    w = world(WorldConfig())
    pool = demo_lib.guess_pool(w.train_tasks)
    searcher = ScriptedSearcher(DemonstratorConfig("mode", p_guess=1.0, guess="mode"), pool)
    demos = demo_lib.run_demonstrations(searcher, env(WorldConfig()), w.test_tasks)
    for d in demos:
        relation = parse_question(d.task.question)[1][-1]
        counts = collections.Counter(pool[relation])
        assert d.turns[0].action == answer_action(counts.most_common(1)[0][0])
    with pytest.raises(ValueError, match="guess"):
        DemonstratorConfig(guess="random")


def test_negative_examples_are_masked_and_recovered():
    demos = _run(DemonstratorConfig("neg", p_negative=1.0), world().test_tasks, max_turns=6)
    assert demo_lib.success_report(demos).success == 1.0
    for d in demos:
        masked = [i for i, t in enumerate(d.turns) if not t.trainable]
        assert len(masked) == 1
        i = masked[0]
        assert not d.log.turns[i].valid and d.log.turns[i].observation == d.turns[i].observation
        assert "invalid" in d.turns[i].observation
        assert d.log.turns[i + 1].valid  # recovery right after the corrective observation
    # Without a spare turn the negative example is skipped rather than costing the answer.
    tight = _run(DemonstratorConfig("neg", p_negative=1.0), world().test_tasks, max_turns=5)
    four_hop = [d for d in tight if d.task.metadata["hops"] == 4]
    assert all(all(t.trainable for t in d.turns) and d.reward == 1.0 for d in four_hop)


def test_repeats_waste_turns_and_are_counted_as_duplicates():
    demos = _run(DemonstratorConfig("rep", p_repeat=1.0), world().test_tasks, max_turns=5)
    by_hops = demo_lib.success_report(demos).by_hops
    assert by_hops[1] == 1.0 and by_hops[4] == 0.0  # 4 hops + repeats exceed 5 turns
    # Each hop read but the last is re-searched once; 3 and 4 hops run out of turns
    # after two repeats (search, repeat, search, repeat, search).
    expected = {1: 0, 2: 1, 3: 2, 4: 2}
    for d in demos:
        assert tool_call_counts(d.log)["duplicate"] == expected[d.task.metadata["hops"]]


def test_stop_early_answers_the_bridge_and_hindsight_makes_it_a_success():
    w = world()
    multi = [t for t in w.test_tasks if t.metadata["hops"] >= 2]
    demos = _run(DemonstratorConfig("early", p_stop_early=1.0), multi)
    assert demo_lib.success_report(demos).success == 0.0
    test_questions = set()
    for d in demos:
        assert episode_answer(d.log) == d.task.metadata["bridge_entities"][-1]
        new = relabel(d.task, d.log, w, exclude_questions=test_questions)
        assert new is not None and new.metadata["hops"] == d.task.metadata["hops"] - 1
        assert exact_match(episode_answer(d.log), new.answers) == 1.0
        assert new.metadata["relabeled_from"] == d.task.task_id


def test_poor_queries_use_name_fragments_and_lose_accuracy():
    w = world()
    names = {e.name for e in w.entities}
    demos = _run(DemonstratorConfig("poor", p_poor_query=1.0), w.test_tasks, max_turns=5)
    queries = [t.action[len("<search> "):-len(" </search>")] for d in demos for t in d.turns
               if t.action.startswith("<search>")]
    # One word of a two-word name, or a one-word name with a vowel changed (which may
    # happen to spell a twin's name — the confusion is the point).
    assert queries and all(len(q.split()) == 1 for q in queries)
    assert sum(q in names for q in queries) < 0.5 * len(queries)
    report = demo_lib.success_report(demos)
    assert 0.0 < report.success < 0.8


def test_imperfect_demonstrator_is_deterministic_and_measured():
    config = DemonstratorConfig("imperfect", p_guess=0.5, p_stop_early=0.1, p_repeat=0.1,
                                p_poor_query=0.1, p_negative=0.1)
    tasks = world().train_tasks
    a, b = _run(config, tasks, seed=7), _run(config, tasks, seed=7)
    assert [[tuple(t) for t in d.turns] for d in a] == [[tuple(t) for t in d.turns] for d in b]
    report = demo_lib.success_report(a)
    assert report.success == pytest.approx(np.mean([d.reward for d in a]))
    # Half the episodes guess, so success leaves clear room above it.
    assert 0.3 < report.success < 0.7
    guessed = sum(len(d.turns) == 1 and d.task.metadata["hops"] >= 1 for d in a) / len(a)
    assert 0.35 < guessed < 0.65


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="p_guess"):
        DemonstratorConfig(p_guess=1.5)
    with pytest.raises(ValueError, match="guess candidates"):
        ScriptedSearcher(DemonstratorConfig(p_guess=0.5))
    task = world().test_tasks[0]
    bad = type(task)("x", "How tall is it?", ("1",))
    with pytest.raises(ValueError, match="not a world question"):
        ScriptedSearcher().run(env(), bad, np.random.default_rng(0))


def test_demonstrations_become_trajectories_with_masked_negatives():
    from agentjax.models.tokenizer import build_tokenizer
    from agentjax.core.trajectory import Trajectory

    w = world()
    demos = _run(DemonstratorConfig("neg", p_negative=1.0), w.test_tasks[:6], max_turns=6)
    texts = [r["contents"] for r in w.corpus_records()] + [
        t.action + (t.observation or "") for d in demos for t in d.turns]
    tokenizer = build_tokenizer(texts, vocab_size=600)
    e = env(max_turns=6)
    for d in demos:
        traj = Trajectory.from_demonstration(tokenizer, d.messages, d.turns,
                                             observation_role=e.observation_role,
                                             reward=d.reward, task=d.task)
        assert [t.trainable for t in traj.turns] == [t.trainable for t in d.turns]
        for built, turn in zip(traj.turns, d.turns):
            # The last action is closed by the template's end-of-turn token.
            closed = built.action_ids[:-1] if turn.observation is None else built.action_ids
            assert tokenizer.decode(closed) == turn.action
            assert tokenizer.decode(built.observation_ids) == (turn.observation or "")
        assert traj.turns[-1].action_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def _facts(task, hops=None):
    return {(h["subject"], h["relation"]) for h in task.metadata["chain"][:hops]}


def test_taught_facts_are_the_hops_whose_object_a_trainable_action_names():
    w = world()
    multi = [t for t in w.test_tasks if t.metadata["hops"] >= 2]
    gold = _run(DemonstratorConfig(), multi)
    assert demo_lib.taught_facts(gold) == set().union(*(_facts(t) for t in multi))
    # A guess names a fact of its chain only by luck; an early stop the hops before it.
    for d in _run(DemonstratorConfig("closed", p_guess=1.0), multi):
        guess = episode_answer(d.log)
        assert demo_lib.taught_facts([d]) == {(h["subject"], h["relation"]) for h in
                                              d.task.metadata["chain"] if h["object"] == guess}
    early = _run(DemonstratorConfig("early", p_stop_early=1.0), multi)
    expected = set().union(*(_facts(t, t.metadata["hops"] - 1) for t in multi))
    assert demo_lib.taught_facts(early) == expected
    # Negative-example turns are loss-masked: they teach nothing.
    negative = _run(DemonstratorConfig("neg", p_negative=1.0), multi, max_turns=6)
    assert demo_lib.taught_facts(negative) == demo_lib.taught_facts(gold)


def test_mark_taught_needs_every_fact_of_the_chain():
    task = next(t for t in world().test_tasks if t.metadata["hops"] == 2)
    assert demo_lib.mark_taught(task, _facts(task)).metadata["taught"] is True
    assert demo_lib.mark_taught(task, _facts(task, 1)).metadata["taught"] is False
    assert "taught" not in task.metadata  # a copy is marked, not the task
    plain = dataclasses.replace(task, metadata={})
    assert demo_lib.mark_taught(plain, set()) is plain


def _renamed_world(w, renaming):
    """`w` with every entity carrying its new name (and that name's aliases)."""
    by_name = {e.name: e for e in w.entities}
    entities = [dataclasses.replace(e, name=renaming[e.name],
                                    aliases=by_name[renaming[e.name]].aliases)
                for e in w.entities]
    return World(w.config, entities, w.facts)


def test_a_renamed_demonstration_is_the_episode_played_in_the_renamed_world():
    w = world()
    renamer = demo_lib.EntityRenamer(w.entities)
    tasks = [t for t in w.train_tasks if t.metadata["hops"] in (1, 3)][:12]

    def top1_env(world_):  # the runner-up documents' BM25 ranks depend on the names
        return SearchEnv(BM25Retriever.from_corpus(world_.corpus_records()), topk=1,
                         max_turns=5, instruction=SHORT_INSTRUCTION)

    demos = demo_lib.run_demonstrations(ScriptedSearcher(), top1_env(w), tasks)
    for i, demo in enumerate(demos):
        renaming = renamer.draw(np.random.default_rng(i))
        renamed = renamer(demo, renaming)
        other = _renamed_world(w, renaming)
        chain = demo.task.metadata["chain"]
        task = other.make_task(chain[0]["subject_id"], [h["relation"] for h in chain], "t")
        [played] = demo_lib.run_demonstrations(ScriptedSearcher(), top1_env(other), [task])
        assert renamed.turns == played.turns and renamed.messages == played.messages
        assert renamed.task.question == task.question and renamed.task.answers == task.answers
        assert [(h["subject"], h["object"]) for h in renamed.task.metadata["chain"]] == [
            (h["subject"], h["object"]) for h in task.metadata["chain"]]
        assert renamed.task.metadata["renamed"] and renamed.reward == demo.reward == 1.0
        assert renamed.task.task_id == demo.task.task_id and "renamed" not in demo.task.metadata
        # Its facts are false in the world: it teaches none of them.
        assert demo_lib.taught_facts([renamed]) == set()


def test_rename_some_renames_a_fraction_of_the_searching_episodes():
    w = world()
    demos = _run(DemonstratorConfig("d", p_guess=0.5, p_poor_query=0.3), w.train_tasks)
    renamer = demo_lib.EntityRenamer(w.entities)
    renameable = [renamer.renameable(d) for d in demos]
    # Guesses never search, fragment queries name no entity: neither can be renamed.
    for d, ok in zip(demos, renameable):
        searches = [t.action for t in d.turns if t.action.startswith("<search>")]
        assert ok == (bool(searches) and all(
            s[len("<search> "):-len(" </search>")] in {e.name for e in w.entities}
            for s in searches))
    assert 0 < sum(renameable) < len(demos)
    assert demo_lib.rename_some(demos, w.entities, 0.0) == demos
    everything = demo_lib.rename_some(demos, w.entities, 1.0)
    assert [d.task.metadata.get("renamed", False) for d in everything] == renameable
    assert [d for d, ok in zip(everything, renameable) if not ok] == [
        d for d, ok in zip(demos, renameable) if not ok]
    half = demo_lib.rename_some(demos, w.entities, 0.5, seed=1)
    share = sum(d.task.metadata.get("renamed", False) for d in half) / sum(renameable)
    assert 0.3 < share < 0.7
    assert half == demo_lib.rename_some(demos, w.entities, 0.5, seed=1)
    with pytest.raises(ValueError, match="cannot be renamed"):
        renamer(demos[renameable.index(False)], renamer.draw(np.random.default_rng(0)))
