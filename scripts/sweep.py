"""Run a config's ablation sweep (arms x seeds) and report it; see agentjax/sweep/.

    python scripts/sweep.py --config configs/grpo_search.py --sweep group_size \
        --seeds 0,1,2 --parallel 2 --out runs/group_size [-- --config.total_steps=30]
    python scripts/sweep.py ... --print-commands   # one command per run, for a scheduler
    python scripts/sweep.py ... --report           # table + plots of existing runs
"""
import sys

from agentjax.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
