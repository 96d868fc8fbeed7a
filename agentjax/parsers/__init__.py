"""agentjax.parsers: policy text in, one parsed action out, never an exception.

A room below both envs (which act on the action) and rewards (which score the episode
from the same text: the outcome reward's last `<answer>` is `actions.last_tag`), so the
env and the reward read a turn with one parser. Formats: Search-R1 tags and hermes-style
tool calls (actions.py); the tool-call formats of model families, by SGLang's and vLLM's
parser names, with detection from a chat template (tool_calls.py).
"""
