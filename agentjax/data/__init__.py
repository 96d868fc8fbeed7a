"""agentjax.data."""
