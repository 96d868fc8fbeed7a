"""A synthetic multi-hop search world, deterministic from a seed.

Fictional, pronounceable entities (people, companies, cities, countries) are joined by
typed functional relations ("Varo Kessin works for Quellon Corp."). Each entity has one
short document stating its outgoing one-hop facts, in templated sentences that always
start with the subject, so both a scripted reader and a ~1M-parameter model can pull the
next entity out of an observation by copying. Some entities are *twins* of others with
confusable names (a shared first name, the same company word with another suffix, a city
one letter apart): a poor query or a sloppy reading lands on the wrong one.

Questions compose 1–4 hops along a chain of distinct entities and read
"What is the country of the birthplace of the founder of the employer of Varo Kessin?";
relations are functional, so every answer is unique. Names are random per seed, so
closed-book accuracy is ~0 by design: the answer must be found by searching.

Every `Task` carries metadata `{"hops", "chain", "bridge_entities", "answer_type",
"world_seed"}`: the chain lists each hop's subject, relation and object (names and ids),
and the bridge entities are the objects of all hops but the last. The process reward and
the scripted demonstrators read it; the policy never sees it.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Mapping, Sequence

import numpy as np
from bm25s.stopwords import STOPWORDS_EN_PLUS

from agentjax.core.task import Task

DATA_SOURCE = "synthetic_multihop"

ENTITY_TYPES = ("person", "company", "city", "country")


@dataclasses.dataclass(frozen=True)
class Relation:
    """A typed functional relation.

    Attributes:
      name: identifier used in task metadata.
      subject_type: entity type of the subject.
      object_type: entity type of the object.
      sentence: document template with `{s}` and `{o}`; always starts with the subject.
      phrase: the noun phrase questions use ("the {phrase} of X").
    """

    name: str
    subject_type: str
    object_type: str
    sentence: str
    phrase: str

    def render(self, subject: str, obj: str) -> str:
        return self.sentence.format(s=subject, o=obj)

    def object_pattern(self, subject: str | None) -> re.Pattern:
        """Regex whose group "o" captures this relation's object in a document.

        Args:
          subject: the subject whose fact to find; None matches any subject (group "s").
            The subject must start a sentence (start of text, or after ". " / ") " / a
            newline), so an entity whose name merely ends with `subject` never matches.
        """
        return _object_pattern(self.sentence, subject)


# Compiled once per (sentence, subject): a demonstrator reads thousands of facts while a
# suite is built, past `re`'s own cache of 512 (compiling was a quarter of the search
# suite's build time).
@functools.lru_cache(maxsize=1 << 16)
def _object_pattern(sentence: str, subject: str | None) -> re.Pattern:
    head, tail = sentence.split("{o}")
    before, after = head.split("{s}")
    who = re.escape(subject) if subject is not None else r"(?P<s>[^.()\n]+?)"
    return re.compile(rf"(?:^|(?<=[.)] )|(?<=\n)){re.escape(before)}{who}"
                      rf"{re.escape(after)}(?P<o>[^.\n]+?){re.escape(tail)}")


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation("born_in", "person", "city", "{s} was born in {o}.", "birthplace"),
        Relation("works_for", "person", "company", "{s} works for {o}.", "employer"),
        Relation("mentor", "person", "person", "{s} was mentored by {o}.", "mentor"),
        Relation("founded_by", "company", "person", "{s} was founded by {o}.", "founder"),
        Relation("based_in", "company", "city", "{s} is based in {o}.", "home city"),
        Relation("country", "city", "country", "{s} is a city in {o}.", "country"),
        Relation("capital", "country", "city", "{s} has the capital {o}.", "capital"),
        Relation("leader", "country", "person", "{s} is led by {o}.", "leader"),
    )
}

_RELATIONS_OF_TYPE = {
    t: tuple(r.name for r in RELATIONS.values() if r.subject_type == t) for t in ENTITY_TYPES
}
_PHRASE_TO_RELATION = {r.phrase: r.name for r in RELATIONS.values()}
_COMPANY_SUFFIXES = {"Corp": "Corporation", "Labs": "Laboratories", "Co": "Company",
                     "Group": "Group Holdings"}
_COUNTRY_PREFIXES = ("Republic of", "Kingdom of", "Federation of")
# Short two-syllable words ("Varo", "Kessin") keep names cheap to tokenize and copy.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "kr", "st", "th", "sh", "tr", "gr")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei")
_CODAS = ("", "", "", "n", "r", "s", "l", "k")
# A name word that is an English stopword ("There") would vanish from BM25 queries.
_RESERVED_WORDS = frozenset(STOPWORDS_EN_PLUS)


@dataclasses.dataclass(frozen=True)
class Entity:
    """One world entity.

    Attributes:
      id: stable id, also the id of its document in the corpus.
      name: canonical name (used in questions and documents).
      type: one of ENTITY_TYPES.
      aliases: other accepted spellings of the name as an answer.
      twin_of: id of the entity this one was made confusable with, else None.
    """

    id: str
    name: str
    type: str
    aliases: tuple[str, ...] = ()
    twin_of: str | None = None


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Sizes of a world.

    Attributes:
      seed: everything (names, facts, questions, splits) is a function of it.
      num_people, num_companies, num_cities, num_countries: entities per type
        (twins included).
      twin_fraction: fraction of each type's entities created as confusable twins.
      train_questions: {hops: count} of training questions.
      test_questions: {hops: count} of held-out questions (disjoint from training).
    """

    seed: int = 0
    num_people: int = 120
    num_companies: int = 40
    num_cities: int = 40
    num_countries: int = 16
    twin_fraction: float = 0.25
    train_questions: Mapping[int, int] = dataclasses.field(
        default_factory=lambda: {1: 300, 2: 300, 3: 200, 4: 200})
    test_questions: Mapping[int, int] = dataclasses.field(
        default_factory=lambda: {1: 50, 2: 50, 3: 50, 4: 50})

    def __post_init__(self):
        for name in ("num_people", "num_companies", "num_cities", "num_countries"):
            if getattr(self, name) < 2:
                raise ValueError(f"WorldConfig.{name} must be >= 2, got {getattr(self, name)}")
        if self.num_cities < self.num_countries:
            raise ValueError(f"WorldConfig: num_cities ({self.num_cities}) must be >= "
                             f"num_countries ({self.num_countries}): every country needs a "
                             "capital among its cities")
        if not 0.0 <= self.twin_fraction < 1.0:
            raise ValueError(f"WorldConfig.twin_fraction must be in [0, 1), "
                             f"got {self.twin_fraction}")
        for name in ("train_questions", "test_questions"):
            for hops, count in getattr(self, name).items():
                if hops not in (1, 2, 3, 4) or count < 0:
                    raise ValueError(f"WorldConfig.{name}: hops must be 1..4 and counts >= 0, "
                                     f"got {{{hops}: {count}}}")


def compose_question(start_name: str, relations: Sequence[str]) -> str:
    """The question text for following `relations` (first hop first) from `start_name`."""
    if not relations:
        raise ValueError("compose_question needs at least one relation")
    unknown = [r for r in relations if r not in RELATIONS]
    if unknown:
        raise ValueError(f"unknown relations {unknown}; known: {sorted(RELATIONS)}")
    body = "".join(f"the {RELATIONS[r].phrase} of " for r in reversed(relations))
    wh = "Who" if RELATIONS[relations[-1]].object_type == "person" else "What"
    return f"{wh} is {body}{start_name}?"


_QUESTION_RE = re.compile(r"^(?:Who|What) is (?P<body>.+)\?$")
_HOP_RE = re.compile(
    "the (" + "|".join(sorted(map(re.escape, _PHRASE_TO_RELATION), key=len, reverse=True))
    + ") of ")


def parse_question(question: str) -> tuple[str, list[str]] | None:
    """Inverse of `compose_question`: (start name, relations first hop first), or None."""
    m = _QUESTION_RE.match(question.strip())
    if m is None:
        return None
    body, relations = m["body"], []
    while (hop := _HOP_RE.match(body)) is not None:
        relations.append(_PHRASE_TO_RELATION[hop.group(1)])
        body = body[hop.end():]
    if not relations or not body:
        return None
    return body, relations[::-1]


class World:
    """Entities, facts, documents and question splits of one seed (see module doc).

    Build with `build_world(config)`.
    """

    def __init__(self, config: WorldConfig, entities: Sequence[Entity],
                 facts: Mapping[tuple[str, str], str]):
        self.config = config
        self.entities: tuple[Entity, ...] = tuple(entities)
        self.facts: dict[tuple[str, str], str] = dict(facts)
        self._by_id = {e.id: e for e in self.entities}
        self._by_name = {e.name: e for e in self.entities}
        self.train_tasks, self.test_tasks = _sample_splits(self)

    def entity(self, entity_id: str) -> Entity:
        return self._by_id[entity_id]

    def by_name(self, name: str) -> Entity | None:
        """The entity whose canonical name is `name`, else None."""
        return self._by_name.get(name)

    def follow(self, start_id: str, relations: Sequence[str]) -> list[str]:
        """Entity ids visited from `start_id` along `relations` (start included)."""
        path = [start_id]
        for relation in relations:
            key = (path[-1], relation)
            if key not in self.facts:
                raise KeyError(f"{self.entity(path[-1]).name!r} has no relation {relation!r}")
            path.append(self.facts[key])
        return path

    def document(self, entity_id: str) -> str:
        """The entity's document text: its outgoing facts, one sentence each."""
        e = self.entity(entity_id)
        return " ".join(RELATIONS[r].render(e.name, self.entity(self.facts[(e.id, r)]).name)
                        for r in _RELATIONS_OF_TYPE[e.type])

    def corpus_records(self) -> list[dict[str, str]]:
        """The corpus in Search-R1 jsonl form: {"id", "contents": '"Title"\\ntext'}."""
        return [{"id": e.id, "contents": f'"{e.name}"\n{self.document(e.id)}'}
                for e in self.entities]

    def make_task(self, start_id: str, relations: Sequence[str], task_id: str) -> Task:
        """The Task asking for the end of `relations` from `start_id`, with metadata."""
        path = self.follow(start_id, relations)
        names = [self.entity(i).name for i in path]
        answer = self.entity(path[-1])
        chain = [{"subject": names[i], "subject_id": path[i], "relation": r,
                  "object": names[i + 1], "object_id": path[i + 1]}
                 for i, r in enumerate(relations)]
        return Task(
            task_id=task_id,
            question=compose_question(names[0], relations),
            answers=(answer.name, *answer.aliases),
            data_source=DATA_SOURCE,
            metadata={"hops": len(relations), "chain": chain,
                      "bridge_entities": names[1:-1], "answer_type": answer.type,
                      "world_seed": self.config.seed},
        )


def build_world(config: WorldConfig = WorldConfig()) -> World:
    """Builds the world of `config` (same config, same world, on every machine)."""
    rng = np.random.default_rng(config.seed)
    names = _NameMaker(rng)
    counts = {"person": config.num_people, "company": config.num_companies,
              "city": config.num_cities, "country": config.num_countries}
    entities: list[Entity] = []
    for etype in ENTITY_TYPES:
        n_twins = int(round(config.twin_fraction * counts[etype]))
        originals = [names.fresh(etype) for _ in range(counts[etype] - n_twins)]
        twin_sources = rng.choice(len(originals), size=n_twins, replace=n_twins > len(originals))
        made = [(name, aliases, None) for name, aliases in originals]
        for source in twin_sources:
            name, aliases = names.twin(etype, originals[source][0])
            made.append((name, aliases, f"{etype}-{source:04d}"))
        for j, (name, aliases, twin_of) in enumerate(made):
            entities.append(Entity(f"{etype}-{j:04d}", name, etype, aliases, twin_of))
    return World(config, entities, _assign_facts(entities, rng))


def other_worlds_documents(config: WorldConfig, count: int) -> list[str]:
    """The corpus documents of `count` worlds sized like `config` but with other seeds
    (`1000 * (config.seed + 1) + k`: other than `config.seed`, and disjoint between two
    seeds for count <= 1000): text in the world's language with other names and facts —
    a pretraining corpus that teaches copying names from context and no fact of
    `config`'s world."""
    documents = []
    for k in range(count):
        other = dataclasses.replace(config, seed=1000 * (config.seed + 1) + k,
                                    train_questions={}, test_questions={})
        documents += [r["contents"] for r in build_world(other).corpus_records()]
    return documents


class _NameMaker:
    """Pronounceable fictional names; distinctive words are globally unique except the
    word a twin deliberately shares with its original."""

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._used_words: set[str] = set()
        self._used_names: set[str] = set()

    def _word(self) -> str:
        while True:
            parts = [_ONSETS[self._rng.integers(len(_ONSETS))]
                     + _VOWELS[self._rng.integers(len(_VOWELS))] for _ in range(2)]
            word = ("".join(parts) + _CODAS[self._rng.integers(len(_CODAS))]).capitalize()
            if word.lower() not in self._used_words and word.lower() not in _RESERVED_WORDS:
                self._used_words.add(word.lower())
                return word

    def _claim(self, name: str, aliases: tuple[str, ...]) -> bool:
        keys = [s.lower() for s in (name, *aliases)]
        if any(k in self._used_names for k in keys):
            return False
        self._used_names.update(keys)
        return True

    def _make(self, etype: str, word: str | None = None, other: str | None = None):
        """A name for `etype`; `word` fixes one distinctive word (twins)."""
        if etype == "person":
            first, last = word or self._word(), self._word()
            if other == "last":
                first, last = last, first
            return f"{first} {last}", ()
        if etype == "company":
            suffix = list(_COMPANY_SUFFIXES)[self._rng.integers(len(_COMPANY_SUFFIXES))]
            base = word or self._word()
            return f"{base} {suffix}", (f"{base} {_COMPANY_SUFFIXES[suffix]}",)
        base = word or self._word()
        if etype == "city":
            return base, ()
        prefix = _COUNTRY_PREFIXES[self._rng.integers(len(_COUNTRY_PREFIXES))]
        return base, (f"{prefix} {base}",)

    def fresh(self, etype: str) -> tuple[str, tuple[str, ...]]:
        while True:
            name, aliases = self._make(etype)
            if self._claim(name, aliases):
                return name, aliases

    def twin(self, etype: str, original: str) -> tuple[str, tuple[str, ...]]:
        """A name confusable with `original`: shares a word (people, companies) or
        differs in one vowel (single-word cities and countries)."""
        for _ in range(100):
            if etype == "person":
                first, last = original.split(" ")
                keep_first = bool(self._rng.integers(2))
                name, aliases = self._make(etype, first if keep_first else last,
                                           None if keep_first else "last")
            elif etype == "company":
                name, aliases = self._make(etype, original.split(" ")[0])
            else:
                vowels = [i for i, ch in enumerate(original) if ch in "aeiou"]
                i = vowels[self._rng.integers(len(vowels))]
                base = original[:i] + "aeiou"[self._rng.integers(5)] + original[i + 1:]
                name, aliases = self._make(etype, base)
                if base.lower() in self._used_words or base.lower() in _RESERVED_WORDS:
                    continue
            if self._claim(name, aliases):
                if etype in ("city", "country"):
                    self._used_words.add(name.lower())
                return name, aliases
        raise ValueError(f"could not make a name confusable with {original!r} that is not "
                         "taken; lower WorldConfig.twin_fraction")


def _balanced(objects: Sequence[str], subjects: Sequence[str],
              rng: np.random.Generator) -> dict[str, str]:
    """Maps each subject to an object so that every object is used floor or ceil of
    len(subjects) / len(objects) times, never mapping an entity to itself.

    Balanced in-degrees keep answer priors flat: a closed-book guesser that always names
    the most frequent answer of a relation gains little.
    """
    reps = -(-len(subjects) // len(objects))
    pool = np.concatenate([rng.permutation(len(objects)) for _ in range(reps)])
    chosen = [objects[i] for i in pool[:len(subjects)]]
    order = rng.permutation(len(subjects))
    mapping = {subjects[i]: chosen[k] for k, i in enumerate(order)}
    selfs = [s for s, o in mapping.items() if s == o]
    for s in selfs:  # swap with another subject; both stay self-free
        for other in subjects:
            if other != s and mapping[other] != s and mapping[s] != other:
                mapping[s], mapping[other] = mapping[other], mapping[s]
                break
    return mapping


def _assign_facts(entities: Sequence[Entity],
                  rng: np.random.Generator) -> dict[tuple[str, str], str]:
    of_type = {t: [e.id for e in entities if e.type == t] for t in ENTITY_TYPES}
    facts: dict[tuple[str, str], str] = {}
    # Cities first: with at least as many cities as countries, every country gets a city
    # and so a capital among its own cities.
    for relation in ("country", "born_in", "works_for", "mentor", "founded_by", "based_in",
                     "leader"):
        r = RELATIONS[relation]
        mapping = _balanced(of_type[r.object_type], of_type[r.subject_type], rng)
        facts.update({(s, relation): o for s, o in mapping.items()})
    for country in of_type["country"]:
        own = [c for c in of_type["city"] if facts[(c, "country")] == country]
        facts[(country, "capital")] = own[rng.integers(len(own))]
    return facts


def _chains(world: World, hops: int) -> list[tuple[str, tuple[str, ...]]]:
    """Every (start id, relations) of `hops` hops visiting distinct entities."""
    out = []

    def extend(path: list[str], relations: tuple[str, ...]):
        if len(relations) == hops:
            out.append((path[0], relations))
            return
        for r in _RELATIONS_OF_TYPE[world.entity(path[-1]).type]:
            nxt = world.facts[(path[-1], r)]
            if nxt not in path:
                extend(path + [nxt], relations + (r,))

    for e in world.entities:
        extend([e.id], ())
    return out


def _sample_splits(world: World) -> tuple[list[Task], list[Task]]:
    cfg = world.config
    rng = np.random.default_rng([cfg.seed, 1])
    train, test = [], []
    for hops in sorted(set(cfg.train_questions) | set(cfg.test_questions)):
        n_test, n_train = cfg.test_questions.get(hops, 0), cfg.train_questions.get(hops, 0)
        chains = _chains(world, hops)
        if n_test + n_train > len(chains):
            raise ValueError(
                f"WorldConfig asks for {n_train} train + {n_test} test questions of {hops} hops "
                f"but the world has only {len(chains)} such chains; lower the counts or "
                "raise the entity counts")
        picked = rng.choice(len(chains), size=n_test + n_train, replace=False)
        for rank, index in enumerate(picked):
            start, relations = chains[index]
            split, bucket = (test, "test") if rank < n_test else (train, "train")
            index = rank if rank < n_test else rank - n_test
            task_id = f"mh{cfg.seed}-{bucket}-{hops}h-{index:05d}"
            split.append(world.make_task(start, relations, task_id))
    return train, test
