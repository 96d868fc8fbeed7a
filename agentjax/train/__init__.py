"""agentjax.train."""
