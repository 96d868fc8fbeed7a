"""agentjax.endpoint: the OpenAI chat-completions API on the rollout engine.

An agent written against the OpenAI API (the openai SDK, an agent framework, a CLI
harness) is pointed at a base URL; each rollout gets its own session in the path
(`/sessions/<id>/v1`), and every call through it is recorded token-exactly: the prompt
ids the chat template rendered, the completion ids, their log-probs and weight versions
(sessions.py). The app (app.py) renders with `models.chat` and reads tool calls with
`parsers.tool_calls`, the renderer and parsers the built-in envs use; the request
fields it honours and refuses are in requests.py, the reply's shape in replies.py.

A room right above engine: it serves any `Engine` and knows no env, agent or trainer;
the runner that turns sessions into trajectories lives above it, and the SGLang-protocol
server mounts the same routes for plain serving (`scripts/serve.py`).
"""
