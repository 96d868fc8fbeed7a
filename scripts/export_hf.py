"""Writes an RL checkpoint of a run as an HF folder (safetensors + config + tokenizer)
that transformers and SGLang load.

    python scripts/export_hf.py --workdir runs/grpo_search --out /tmp/policy [--step 40]

Runs already export their final policy to <workdir>/hf; this script exports any
intermediate orbax checkpoint.
"""
import os

from absl import app, flags, logging

from agentjax.config.schema import exit_on_config_error, is_run_folder

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
    # Imported after flag validation: a wrong flag fails before JAX and the trainer load.
    from flax import nnx

    from agentjax.models import save_hf
    from agentjax.config.schema import load_saved
    from agentjax.train.trainer import Trainer

    config = load_saved(os.path.join(_WORKDIR.value, "config.json"))
    trainer = Trainer(config, _WORKDIR.value)
    params = trainer.restore_params(_STEP.value)
    # In the compute dtype, as the run's own exports (not the float32 training masters).
    save_hf(nnx.merge(trainer.graphdef, params), trainer.model_config, _OUT.value,
            dtype=trainer.model_config.dtype, tokenizer=trainer.tokenizer)
    trainer.close()
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
