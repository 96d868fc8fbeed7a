"""agentjax.data: what every env's data goes through, owned by none: task samplers
(curriculum.py), demonstration records and their JSONL (demonstrations.py), row-by-row
task file loading (rows.py), offline episodes and preference pairs (offline_jsonl.py).
It imports no env: a world, its loaders and its demonstrators live in the env's folder
(agentjax/envs/<name>/)."""
