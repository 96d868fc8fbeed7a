"""Serve a policy (a local HF folder) with agentjax's engine over SGLang's native HTTP API.

    python scripts/serve.py --model-path runs/grpo_search/hf --port 30000 [--lanes 2]

The server lives in the package (`agentjax/sglang/server/main.py`: flags, start-up,
shutdown), so a trainer can launch it as `python -m agentjax.sglang.server.main`
wherever agentjax is installed.
"""
from agentjax.sglang.server.main import main

if __name__ == "__main__":
    main()
