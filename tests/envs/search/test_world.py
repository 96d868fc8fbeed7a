import collections
import re

import pytest
from bm25s.stopwords import STOPWORDS_EN_PLUS

from agentjax.envs.search import world as world_lib
from agentjax.envs.search.world import (RELATIONS, WorldConfig, build_world, compose_question,
                                 parse_question)
from agentjax.rewards.outcome import normalize_answer
from tests.envs.search.worlds import SMALL, world


def test_same_seed_same_world_other_seed_other_names():
    a, b = build_world(SMALL), world()
    assert a.corpus_records() == b.corpus_records()
    assert [(t.task_id, t.question, t.answers) for t in a.train_tasks + a.test_tasks] == \
           [(t.task_id, t.question, t.answers) for t in b.train_tasks + b.test_tasks]
    other = build_world(WorldConfig(**{**SMALL.__dict__, "seed": 4}))
    assert not {e.name for e in other.entities} & {e.name for e in a.entities}


def test_other_worlds_share_the_language_but_no_fact():
    docs = world_lib.other_worlds_documents(SMALL, 2)
    assert docs == world_lib.other_worlds_documents(SMALL, 2)
    per_world = len(world().entities)
    assert len(docs) == 2 * per_world
    assert docs[:per_world] == [r["contents"] for r in build_world(WorldConfig(
        **{**SMALL.__dict__, "seed": 4000, "train_questions": {}, "test_questions": {}})
    ).corpus_records()]
    main_docs = {r["contents"] for r in world().corpus_records()}
    assert not main_docs & set(docs)
    assert not set(docs) & set(world_lib.other_worlds_documents(
        WorldConfig(**{**SMALL.__dict__, "seed": 4}), 2))
    verbs = {r.sentence.split("{o}")[0].split("{s}")[1] for r in RELATIONS.values()}
    assert all(any(v in d for v in verbs) for d in docs)


def test_entity_counts_twins_and_unique_names():
    w = world()
    counts = collections.Counter(e.type for e in w.entities)
    assert counts == {"person": 40, "company": 12, "city": 12, "country": 6}
    twins = [e for e in w.entities if e.twin_of]
    assert collections.Counter(e.type for e in twins) == {"person": 10, "company": 3,
                                                          "city": 3, "country": 2}
    spellings = [normalize_answer(s) for e in w.entities for s in (e.name, *e.aliases)]
    assert len(spellings) == len(set(spellings))
    words = {word.lower() for e in w.entities for word in e.name.split()}
    assert not words & set(STOPWORDS_EN_PLUS)
    # Distinctive words are shared only by deliberate twins (and company suffixes).
    suffixes = {"corp", "labs", "co", "group"}
    owners = collections.defaultdict(set)
    for e in w.entities:
        for word in e.name.lower().split():
            if word not in suffixes:
                owners[word].add(e.twin_of or e.id)
    assert all(len(o) == 1 for o in owners.values())


def test_twins_are_confusable():
    w = world()
    for e in (e for e in w.entities if e.twin_of):
        original = w.entity(e.twin_of)
        if e.type in ("person", "company"):
            assert set(e.name.split()) & set(original.name.split())
        else:
            assert len(e.name) == len(original.name)
            assert sum(x != y for x, y in zip(e.name, original.name)) == 1


def test_documents_state_each_fact_once_and_read_back():
    w = world()
    records = {r["id"]: r["contents"] for r in w.corpus_records()}
    assert set(records) == {e.id for e in w.entities}
    for e in w.entities:
        title, text = records[e.id].split("\n", 1)
        assert title == f'"{e.name}"'
        relations = [r for r in RELATIONS.values() if r.subject_type == e.type]
        assert len(re.findall(r"\.(?: |$)", text)) == len(relations)  # one sentence a fact
        for r in relations:
            obj = w.entity(w.facts[(e.id, r.name)])
            assert obj.type == r.object_type
            assert r.object_pattern(e.name).findall(text) == [obj.name]
    # In-degrees are balanced (flat answer priors) and no one mentors themselves.
    for r in RELATIONS.values():
        if r.name == "capital":
            continue
        uses = collections.Counter(w.facts[(e.id, r.name)] for e in w.entities
                                   if e.type == r.subject_type)
        assert max(uses.values()) - min(uses.values()) <= 1
    assert all(w.facts[(e.id, "mentor")] != e.id for e in w.entities if e.type == "person")
    # Every country's capital is one of its own cities.
    for c in (e for e in w.entities if e.type == "country"):
        assert w.facts[(w.facts[(c.id, "capital")], "country")] == c.id


def test_question_text_round_trips():
    relations = ["works_for", "based_in", "country"]
    q = compose_question("Varo Kessin", relations)
    assert q == "What is the country of the home city of the employer of Varo Kessin?"
    assert parse_question(q) == ("Varo Kessin", relations)
    assert compose_question("Quellon Corp", ["founded_by"]).startswith("Who is the founder")
    assert parse_question("What is love?") is None
    assert parse_question("Who is the founder of ?") is None
    with pytest.raises(ValueError, match="unknown relations"):
        compose_question("X", ["sibling"])


def test_tasks_have_unique_answers_metadata_and_disjoint_splits():
    w = world()
    for split, config in ((w.train_tasks, SMALL.train_questions),
                          (w.test_tasks, SMALL.test_questions)):
        assert collections.Counter(t.metadata["hops"] for t in split) == config
    assert not {t.question for t in w.train_tasks} & {t.question for t in w.test_tasks}
    all_tasks = w.train_tasks + w.test_tasks
    assert len({t.task_id for t in all_tasks}) == len(all_tasks)
    assert len({t.question for t in all_tasks}) == len(all_tasks)
    for t in all_tasks:
        start, relations = parse_question(t.question)
        chain = t.metadata["chain"]
        assert [h["relation"] for h in chain] == relations and chain[0]["subject"] == start
        path = w.follow(chain[0]["subject_id"], relations)
        assert len(set(path)) == len(path)  # no entity visited twice
        answer = w.entity(path[-1])
        assert t.answers == (answer.name, *answer.aliases)
        assert t.metadata["bridge_entities"] == [w.entity(i).name for i in path[1:-1]]
        assert t.metadata["answer_type"] == answer.type
        assert t.data_source == world_lib.DATA_SOURCE


def test_closed_book_accuracy_is_near_zero():
    # The best a non-searching policy can do from the training data: answer the most
    # frequent training answer for the question's final relation.
    w = build_world(WorldConfig())
    by_relation = collections.defaultdict(collections.Counter)
    for t in w.train_tasks:
        by_relation[t.metadata["chain"][-1]["relation"]][t.answers[0]] += 1
    hits = [by_relation[t.metadata["chain"][-1]["relation"]].most_common(1)[0][0] in t.answers
            for t in w.test_tasks]
    assert sum(hits) / len(hits) < 0.06
    # Nothing in a question names its answer.
    assert not any(normalize_answer(a) in normalize_answer(t.question)
                   for t in w.test_tasks for a in t.answers)


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match="only .* such chains"):
        build_world(WorldConfig(num_people=2, num_companies=2, num_cities=2, num_countries=2,
                                train_questions={4: 5000}, test_questions={}))
    with pytest.raises(ValueError, match="num_cities"):
        WorldConfig(num_cities=1)
    with pytest.raises(ValueError, match="capital"):
        WorldConfig(num_cities=5, num_countries=6)
    with pytest.raises(ValueError, match="hops must be 1..4"):
        WorldConfig(train_questions={5: 10})
    with pytest.raises(ValueError, match="twin_fraction"):
        WorldConfig(twin_fraction=1.0)
