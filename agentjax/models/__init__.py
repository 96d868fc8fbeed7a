"""agentjax.models."""
