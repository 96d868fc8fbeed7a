"""Writes an RL checkpoint of a run as an HF folder (safetensors + config + tokenizer)
that transformers and SGLang load.

    python scripts/export_hf.py --workdir runs/grpo_search --out /tmp/policy [--step 40]

Runs already export their final policy to <workdir>/hf; this script exports any
intermediate orbax checkpoint.
"""
import os

from absl import app, flags, logging

from agentjax.config import exit_on_config_error, is_run_folder

_WORKDIR = flags.DEFINE_string("workdir", None, "the run folder (has config.json)")
_OUT = flags.DEFINE_string("out", None, "output HF folder")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
flags.register_validator("workdir", lambda workdir: workdir is None or is_run_folder(workdir),
                         "must be a run folder (one with config.json)")
flags.mark_flags_as_required(["workdir", "out"])


@exit_on_config_error
def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    # Imported after flag validation: a wrong flag fails before JAX loads.
    from agentjax.config import load_saved
    from agentjax.train.policy import Policy
    from agentjax.train.runtime import Runtime
    from agentjax.train.stages.rl import init_rl_state

    config = load_saved(os.path.join(_WORKDIR.value, "config.json"))
    runtime = Runtime.start(config, _WORKDIR.value, record_config=False)
    policy = Policy.load(config, runtime, texts=_no_texts, plan_memory=False)
    state = init_rl_state(config, policy.graphdef, policy.params)[0]
    checkpointer = runtime.checkpointer(runtime.workdir, read_only=True)
    try:
        restored = checkpointer.restore(state, _STEP.value)
    finally:
        checkpointer.close()
    if restored is None:
        raise FileNotFoundError(f"no RL checkpoint in {runtime.workdir}/checkpoints")
    # In the compute dtype, as the run's own exports (not the float32 training masters).
    policy.export(restored[0].params, _OUT.value)
    print(f"wrote {_OUT.value}")


def _no_texts():
    raise FileNotFoundError(f"{_WORKDIR.value}/init_model is missing: the run's own tiny "
                            "model cannot be rebuilt from a config alone")


if __name__ == "__main__":
    app.run(main)
