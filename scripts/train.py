"""Train an agent: `python scripts/train.py --config configs/grpo_search.py`."""
import sys


def main() -> int:
    print("agentjax: the trainer has not landed yet (see the trainer issue); "
          "`python -m pytest -q -n 2 tests` runs what exists.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
