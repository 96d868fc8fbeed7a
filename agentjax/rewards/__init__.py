"""agentjax.rewards."""
