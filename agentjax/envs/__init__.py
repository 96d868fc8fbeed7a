"""agentjax.envs."""
