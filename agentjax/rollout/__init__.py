"""agentjax.rollout: exact multi-turn trajectories, the Engine protocol, the in-process
JaxEngine, the agent loop and the RolloutPool (see each module's docstring)."""
from agentjax.rollout.agent_loop import EpisodeLimits, run_episode
from agentjax.rollout.engine import Completion, Engine, GenerateRequest, SamplingParams
from agentjax.rollout.jax_engine import JaxEngine
from agentjax.rollout.pool import PoolProgress, RolloutPool
from agentjax.rollout.trajectory import Trajectory, Turn, collate, observation_token_ids

__all__ = [
    "Completion", "Engine", "EpisodeLimits", "GenerateRequest", "JaxEngine", "PoolProgress",
    "RolloutPool", "SamplingParams", "Trajectory", "Turn", "collate", "observation_token_ids",
    "run_episode",
]
