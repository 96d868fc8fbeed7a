"""Scripted demonstrators for the multi-hop search world (SFT warm-start).

A demonstrator acts in a real `SearchEnv` (real BM25 retrieval, real observations) the
way a model would: it parses the question into a start entity and relation chain, issues
`<search> name </search>`, reads the next entity out of the observation text with the
relation's sentence pattern, and finally writes `<answer> name </answer>`. It never
looks at the task's answers or metadata — only the question and the observations.

`DemonstratorConfig()` is the gold policy (scores 1.0 on a well-formed world). Knobs
make it imperfect, each a probability:
  p_guess       per episode: answer at once without searching, with a guess from the
                training answers of questions ending in the same relation: a random one
                (guess="sample") or the most frequent one (guess="mode", a closed-book
                prior: SFT learns one lazy answer per relation instead of memorizing a
                random name per question, which a tiny model then also emits where it
                should copy from an observation);
  p_stop_early  per episode of >= 2 hops: answer the bridge entity one hop early;
  p_repeat      per hop read (but the last): issue the same query once more before
                moving on (a wasted turn; with a tight turn budget the episode can run
                out of turns);
  p_poor_query  per search: query a fragment of the name (one word of a two-word name,
                a misspelled one-word name) and read sloppily — take the first sentence
                of the right relation about *anyone*, which under BM25 with confusable
                twins is often the wrong entity;
  p_negative    per episode: one malformed action (Agent-FLAN negative example) followed
                by the env's corrective observation and the correct action; the malformed
                turn is marked `trainable=False` (SFT learns the recovery, not the error)
                and is only inserted when the turn budget has room for it.

Each episode is a `data.demonstrations.Demonstration`: every observation exactly as the
env returned it, ready for `Trajectory.from_demonstration`.

`EntityRenamer` turns a searching demonstration into a counterfactual one (every entity
name in it replaced by another of the same type, one bijection per episode): the same
actions, but facts that are false in the world, so SFT can reproduce its answer only by
reading the observations, not by recalling the world.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from agentjax.config.choices import GUESSES
from agentjax.core.task import Task
from agentjax.data.demonstrations import Demonstration, DemoTurn
from agentjax.envs.search.world import RELATIONS, Entity, parse_question
from agentjax.parsers.actions import parse_search_r1
from agentjax.rewards.outcome import episode_answer, exact_match

_MALFORMED = ("{q}", "<query> {q} </query>", "<search> </search>", "<search> {q} </answer>")


@dataclasses.dataclass(frozen=True)
class DemonstratorConfig:
    """Imperfection knobs (module docstring); all zero is the gold policy.

    Attributes:
      name: recorded in each Demonstration.
      p_guess, p_stop_early, p_repeat, p_poor_query, p_negative: see module docstring.
      guess: how a guess is picked, "sample" or "mode" (module docstring).
    """

    name: str = "gold"
    p_guess: float = 0.0
    p_stop_early: float = 0.0
    p_repeat: float = 0.0
    p_poor_query: float = 0.0
    p_negative: float = 0.0
    guess: str = "sample"

    def __post_init__(self):
        if self.guess not in GUESSES:
            raise ValueError(f"DemonstratorConfig.guess must be one of {GUESSES}, "
                             f"got {self.guess!r}")
        for field in dataclasses.fields(self):
            if field.name.startswith("p_") and not 0.0 <= getattr(self, field.name) <= 1.0:
                raise ValueError(f"DemonstratorConfig.{field.name} must be in [0, 1], "
                                 f"got {getattr(self, field.name)}")


def guess_pool(tasks: Sequence[Task]) -> dict[str, list[str]]:
    """Guess candidates: the answers of `tasks` grouped by the question's last relation
    (with multiplicity, so frequent answers are guessed more often)."""
    pool: dict[str, list[str]] = collections.defaultdict(list)
    for task in tasks:
        parsed = parse_question(task.question)
        if parsed is not None and task.answers:
            pool[parsed[1][-1]].append(task.answers[0])
    return dict(pool)


def search_action(query: str) -> str:
    return f"<search> {query} </search>"


def answer_action(answer: str) -> str:
    return f"<answer> {answer} </answer>"


def _poor_query(name: str, rng: np.random.Generator) -> str:
    words = name.split()
    if len(words) > 1:
        return words[int(rng.integers(len(words)))]
    vowels = [i for i, ch in enumerate(name) if ch in "aeiou"]
    i = vowels[int(rng.integers(len(vowels)))] if vowels else len(name) - 1
    other = [v for v in "aeiou" if v != name[i]]
    return name[:i] + other[int(rng.integers(len(other)))] + name[i + 1:]


def _observation(result) -> str | None:
    return None if result.done else result.observation


def read_object(observation: str, relation: str, subject: str | None) -> str | None:
    """The object of `relation` for `subject` (None: for the first subject found) stated
    in `observation`, else None."""
    match = RELATIONS[relation].object_pattern(subject).search(observation)
    return match.group("o").strip() if match else None


class ScriptedSearcher:
    """A scripted policy of controllable quality (module docstring).

    Args:
      config: the imperfection knobs.
      guesses: guess candidates per final relation (`guess_pool(train_tasks)`); needed
        when config.p_guess > 0.
    """

    def __init__(self, config: DemonstratorConfig = DemonstratorConfig(),
                 guesses: Mapping[str, Sequence[str]] | None = None):
        if config.p_guess > 0 and not guesses:
            raise ValueError("ScriptedSearcher: p_guess > 0 needs guess candidates "
                             "(guesses=guess_pool(train_tasks))")
        self.config = config
        self.guesses = {k: list(v) for k, v in (guesses or {}).items()}

    def _guess(self, relation: str, rng: np.random.Generator) -> str:
        pool = self.guesses.get(relation) or [n for v in self.guesses.values() for n in v]
        if self.config.guess == "mode":
            return collections.Counter(pool).most_common(1)[0][0]
        return pool[int(rng.integers(len(pool)))]

    def run(self, env, task: Task, rng: np.random.Generator, *, reward_fn=None) -> Demonstration:
        """Plays one episode of `task` in `env` (a SearchEnv with tag actions).

        Args:
          env: the env; reset here.
          task: a world task (its question must parse with `world.parse_question`).
          rng: this episode's random stream.
          reward_fn: `(task, log) -> (total, components)`; default exact match.
        """
        parsed = parse_question(task.question)
        if parsed is None:
            raise ValueError(f"task {task.task_id!r}: question is not a world question: "
                             f"{task.question!r}")
        current, relations = parsed
        cfg = self.config
        guess = rng.random() < cfg.p_guess
        target_hops = len(relations) - 1 if (
            len(relations) >= 2 and rng.random() < cfg.p_stop_early) else len(relations)
        negative = rng.random() < cfg.p_negative
        budget = getattr(env, "max_turns", None)
        messages = env.reset(task)
        turns: list[DemoTurn] = []
        hop, last_query, repeat_pending = 0, None, False
        while not env.log.done:
            needed = 1 if guess else (target_hops - hop) + 1 + int(repeat_pending)
            if negative and (budget is None or len(turns) + needed + 1 <= budget) and (
                    rng.random() < 1.0 / needed):
                negative = False
                text = _MALFORMED[int(rng.integers(len(_MALFORMED)))].format(q=current)
                turns.append(DemoTurn(text, _observation(env.step(text)), False))
                continue
            fresh_search = False
            if guess:
                text = answer_action(self._guess(relations[-1], rng))
            elif hop == target_hops:
                text = answer_action(current)
            elif repeat_pending:  # re-issues the query it already read: nothing new to read
                text, repeat_pending = search_action(last_query), False
            else:
                poor = rng.random() < cfg.p_poor_query
                last_query = _poor_query(current, rng) if poor else current
                text, fresh_search = search_action(last_query), True
            observation = _observation(env.step(text))
            turns.append(DemoTurn(text, observation, True))
            if fresh_search:
                # A fragment query is read sloppily: the relation's first fact about anyone.
                found = read_object(observation or "", relations[hop],
                                    current if last_query == current else None)
                if found is not None and found != current:
                    current, hop = found, hop + 1
                    repeat_pending = hop < target_hops and rng.random() < cfg.p_repeat
        log = env.log
        if reward_fn is None:
            reward = exact_match(episode_answer(log), task.answers)
        else:
            reward = float(reward_fn(task, log)[0])
        return Demonstration(task, messages, turns, log, reward, cfg.name)


class SuccessReport(NamedTuple):
    """A policy's measured success: overall, per hop count, and counts."""

    success: float
    by_hops: dict[int, float]
    episodes: int
    mean_turns: float


class EntityRenamer:
    """Counterfactual copies of searching demonstrations (module docstring).

    Every canonical entity name in a demonstration's question, actions and observations
    is replaced through a random permutation of the names of its type, drawn per episode;
    the task (answers, chain, bridge entities) is renamed alike and marked
    `metadata["renamed"]`. Only episodes whose every search queries a full entity name are
    renamed (a fragment query would stay pointing at the old name).

    Args:
      entities: the world's entities.
    """

    def __init__(self, entities: Sequence[Entity]):
        self._by_name = {e.name: e for e in entities}
        self._names_of_type: dict[str, list[str]] = collections.defaultdict(list)
        for e in entities:
            self._names_of_type[e.type].append(e.name)
        # Longest first, so a name is never matched by a shorter one inside it.
        names = sorted(self._by_name, key=len, reverse=True)
        self._pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, names)) + r")(?!\w)")

    def renameable(self, demo: Demonstration) -> bool:
        """Whether `demo` searches, and only for full entity names."""
        queries = [a.query for a in (parse_search_r1(t.action) for t in demo.turns)
                   if a.kind == "search"]
        return bool(queries) and all(q in self._by_name for q in queries)

    def draw(self, rng: np.random.Generator) -> dict[str, str]:
        """A random renaming: a permutation of each type's names."""
        renaming = {}
        for names in self._names_of_type.values():
            renaming.update(zip(names, rng.permutation(names).tolist()))
        return renaming

    def __call__(self, demo: Demonstration, renaming: Mapping[str, str]) -> Demonstration:
        """`demo` renamed by `renaming` (from `draw`; `demo` must be `renameable`)."""
        if not self.renameable(demo):
            raise ValueError(f"demonstration of {demo.task.task_id!r} does not search for "
                             "full entity names only: it cannot be renamed consistently")

        def text(s: str) -> str:
            return self._pattern.sub(lambda m: renaming[m.group(0)], s)

        def entity(name: str) -> Entity:
            return self._by_name[renaming[name]]

        task = demo.task
        answer = entity(task.answers[0])
        chain = [{**hop, "subject": entity(hop["subject"]).name,
                  "subject_id": entity(hop["subject"]).id,
                  "object": entity(hop["object"]).name, "object_id": entity(hop["object"]).id}
                 for hop in task.metadata.get("chain", ())]
        metadata = {**task.metadata, "chain": chain, "renamed": True,
                    "bridge_entities": [renaming[n] for n in
                                        task.metadata.get("bridge_entities", ())]}
        task = dataclasses.replace(task, question=text(task.question),
                                   answers=(answer.name, *answer.aliases), metadata=metadata)
        messages = [{**m, "content": text(m["content"])} for m in demo.messages]
        turns = [DemoTurn(text(t.action), None if t.observation is None else text(t.observation),
                          t.trainable) for t in demo.turns]
        return Demonstration(task, messages, turns, None, demo.reward, demo.policy)


def rename_some(demos: Sequence[Demonstration], entities: Sequence[Entity], fraction: float,
                *, seed: int = 0) -> list[Demonstration]:
    """`demos` with a `fraction` of the renameable ones replaced by renamed copies
    (`EntityRenamer`); episode i draws from the random stream (seed, i, 1) — not from
    (seed, i), the stream `run_demonstrations` played it with, whose first draw decided
    whether it guesses (and so whether it searches)."""
    renamer = EntityRenamer(entities)
    out = []
    for i, demo in enumerate(demos):
        rng = np.random.default_rng([seed, i, 1])
        if renamer.renameable(demo) and rng.random() < fraction:
            demo = renamer(demo, renamer.draw(rng))
        out.append(demo)
    return out


def run_demonstrations(searcher: ScriptedSearcher, env, tasks: Sequence[Task], *,
                       seed: int = 0, reward_fn=None) -> list[Demonstration]:
    """Plays every task once; episode i uses the random stream (seed, i).

    Args:
      searcher: the demonstrator.
      env: a SearchEnv (tags format).
      tasks: the tasks, in order.
      seed: base seed.
      reward_fn: optional `(task, log) -> (total, components)`; default exact match.
    """
    return [searcher.run(env, task, np.random.default_rng([seed, i]), reward_fn=reward_fn)
            for i, task in enumerate(tasks)]


def success_report(demos: Sequence[Demonstration]) -> SuccessReport:
    """Success rate (answer exact match) overall and per hop count of demonstrations."""
    if not demos:
        raise ValueError("success_report needs at least one demonstration")
    wins = [exact_match(episode_answer(d.log), d.task.answers) if d.log is not None
            else float(d.reward) for d in demos]
    by_hops: dict[int, list[float]] = collections.defaultdict(list)
    for d, w in zip(demos, wins):
        by_hops[int(d.task.metadata.get("hops", 0))].append(w)
    return SuccessReport(float(np.mean(wins)), {k: float(np.mean(v)) for k, v in
                                                 sorted(by_hops.items())},
                         len(demos), float(np.mean([len(d.turns) for d in demos])))


def taught_facts(demos: Sequence[Demonstration]) -> set[tuple[str, str]]:
    """The world facts (subject, relation) that SFT on `demos` trains the policy to state:
    a hop of a demonstration's question chain whose object one of its trainable actions
    names (as a query or as the answer). A guessed episode teaches none of its facts, an
    early stop only the hops before it.

    Held-out success on questions whose every fact is taught can come from memory; on
    the others the agent has to read the observation (`mark_taught`). A renamed
    demonstration (`EntityRenamer`) states false facts and teaches none."""
    facts = set()
    for d in demos:
        if d.task.metadata.get("renamed"):
            continue
        named = set()
        for turn in d.turns:
            if turn.trainable:
                action = parse_search_r1(turn.action)
                named.add(action.query if action.kind == "search" else action.answer)
        facts.update((hop["subject"], hop["relation"])
                     for hop in d.task.metadata.get("chain", ()) if hop["object"] in named)
    return facts


def mark_taught(task: Task, facts: set[tuple[str, str]]) -> Task:
    """`task` with `metadata["taught"]`: whether every fact of its chain is in `facts`
    (`taught_facts`); unchanged for a task without a chain."""
    chain = task.metadata.get("chain")
    if not chain:
        return task
    taught = all((hop["subject"], hop["relation"]) in facts for hop in chain)
    return dataclasses.replace(task, metadata={**task.metadata, "taught": taught})


def measure_success(searcher: ScriptedSearcher, env, tasks: Sequence[Task], *,
                    seed: int = 0) -> SuccessReport:
    """Runs the demonstrator on `tasks` and reports its success (see success_report)."""
    return success_report(run_demonstrations(searcher, env, tasks, seed=seed))
