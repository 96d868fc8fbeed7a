"""No action string costs an episode or stalls the loop: the seeded fuzz corpus through
the parsers, the envs, the rewards and the agent loop."""
import asyncio

import pytest

from agentjax.envs import sandbox as sandbox_lib
from agentjax.envs.sandbox import Sandbox
from agentjax.envs.turns import valid_utf8
from agentjax.models.tokenizer import build_tokenizer
from agentjax.agents.loop import EpisodeLimits, run_episode
from agentjax.engine.protocol import SamplingParams
from tests.envs.fuzz_corpus import GENERATORS, TASK, fuzz_actions, fuzz_envs, run_fuzz
from tests.agents.fakes import CORPUS, ScriptedEngine

pytestmark = pytest.mark.skipif(
    sandbox_lib.shutil.which("bwrap") is None,
    reason="bubblewrap missing: apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(max_parallel=1, memory_mb=256)


def test_corpus_is_seeded_and_covers_every_category():
    actions = fuzz_actions(seed=3, count=300)
    assert actions == fuzz_actions(seed=3, count=300) != fuzz_actions(seed=4, count=300)
    assert {category for category, _ in actions} == set(GENERATORS)


def test_every_fuzz_case_holds(sandbox):
    # ~20 s alone on one core, most of it in the ~1 MB cases and the sandbox runs.
    actions = fuzz_actions(seed=0, count=300)
    result = run_fuzz(actions, sandbox=sandbox)
    assert not result.failures, "\n".join(result.failures)
    assert sum(tried for tried, _, _ in result.counts.values()) == len(actions)
    assert all(tried == held for tried, held, _ in result.counts.values())


def test_fuzz_actions_never_end_an_episode_as_env_error(sandbox):
    """Through the agent loop: each action, then an answer; no episode fails."""
    tokenizer = build_tokenizer(CORPUS * 4, vocab_size=384)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4096)
    limits = EpisodeLimits(max_turns=2, max_context_tokens=16384)
    envs = fuzz_envs(sandbox)
    for _, action in fuzz_actions(seed=1, count=40):
        # An engine's action decodes from at most max_new_tokens ids: valid UTF-8, and
        # the fake engine need not tokenize a megabyte to cut it.
        script = [valid_utf8(action[:20_000]), "<answer>Acme Dynamics</answer>"]
        for env in envs:
            engine = ScriptedEngine(tokenizer, lambda context, i: script[min(i, 1)])
            traj = asyncio.run(run_episode(engine, env, TASK, sampling, limits, tokenizer))
            assert not traj.metadata["failed"], (traj.metadata["error"], action[:80])
            assert traj.metadata["stop_reason"] in ("answer", "max_turns", "token_budget")
