"""agentjax.rollout."""
