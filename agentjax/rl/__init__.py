"""agentjax.rl."""
