"""Success of a trained policy on a split: greedy and sampled, pass@k, per hop count.

    python scripts/evaluate.py --workdir runs/grpo_search [--model runs/grpo_search/hf]
        [--split test] [--num_tasks 200] [--samples 4]

Uses the run's own config (<workdir>/config.json with the changes its resumes accepted,
config_changes.jsonl) to rebuild its world, env and reward;
`--model` is any HF folder of a policy (default: the run's final export <workdir>/hf).
"""
import os

import numpy as np
from absl import app, flags, logging

from agentjax.core import atomic
from agentjax.config import exit_on_config_error, is_run_folder

_WORKDIR = flags.DEFINE_string("workdir", None, "the run folder (has config.json)")
_MODEL = flags.DEFINE_string("model", None, "HF folder of the policy (default <workdir>/hf)")
_SPLIT = flags.DEFINE_enum("split", "test", ["test", "train"], "which tasks")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", 200, "tasks to evaluate (a fixed subset)")
_SAMPLES = flags.DEFINE_integer("samples", 4, "sampled episodes per task (pass@k)")
flags.register_multi_flags_validator(
    ["workdir", "model"],
    lambda given: given["workdir"] is None or not is_run_folder(given["workdir"])
    or os.path.isdir(given["model"] or os.path.join(given["workdir"], "hf")),
    "--model (default: <workdir>/hf, a finished run's export) must be an existing HF folder")
flags.register_validator("workdir", lambda workdir: workdir is None or is_run_folder(workdir),
                         "must be a run folder (one with config.json)")
flags.mark_flags_as_required(["workdir"])


@exit_on_config_error
def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    # Imported after flag validation: a wrong flag fails before JAX loads.
    from agentjax.config.resume import config_in_effect
    from agentjax.train.run import set_up

    config = config_in_effect(_WORKDIR.value)
    config.init_from = _MODEL.value or os.path.join(_WORKDIR.value, "hf")
    config.eval.samples = _SAMPLES.value
    out_dir = os.path.join(_WORKDIR.value, "evaluate")
    # The results go to <workdir>/evaluate, not to a tracker run of their own.
    _, suite, policy, rollouts = set_up(config, out_dir, tracked=False)
    tasks = suite.test_tasks if _SPLIT.value == "test" else suite.train_tasks
    order = np.random.default_rng(0).permutation(len(tasks))[:_NUM_TASKS.value]
    try:
        results = rollouts.evaluate(policy.params, _SPLIT.value, [tasks[i] for i in order])
    finally:
        rollouts.close()
    for key, value in sorted(results.items()):
        print(f"{key:40s} {value:.4f}")
    atomic.write_json(os.path.join(out_dir, f"{_SPLIT.value}.json"), results)


if __name__ == "__main__":
    app.run(main)
