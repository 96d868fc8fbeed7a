"""Writes an RL checkpoint of a run as an HF folder (safetensors + config + tokenizer)
that transformers and SGLang load.

    python scripts/export_hf.py --workdir runs/grpo_search --out /tmp/policy [--step 40]

Runs already export their final policy to <workdir>/hf; this script exports any
intermediate orbax checkpoint. The export replaces `--out` as a whole (and, for a LoRA
run, its sibling `adapter/` with the PEFT adapter), so it writes only into a folder that
is missing, empty or an earlier export of this script, which it recognizes by the
marker file it writes there (agentjax_export.json: the run and step exported); any
other folder is refused, its files left alone (train/policy.py: export_refusal).
"""
import datetime
import json
import sys

from absl import app, flags, logging

from agentjax.config import exit_on_config_error, is_run_folder

_WORKDIR = flags.DEFINE_string("workdir", None, "the run folder (has config.json)")
_OUT = flags.DEFINE_string("out", None, "output HF folder: missing, empty or an earlier "
                           "export (replaced)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
flags.register_validator("workdir", lambda workdir: workdir is None or is_run_folder(workdir),
                         "must be a run folder (one with config.json)")
flags.mark_flags_as_required(["workdir", "out"])


@exit_on_config_error
def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    # Imported after flag validation: a wrong flag fails before JAX loads.
    from agentjax.config.resume import config_in_effect

    config = config_in_effect(_WORKDIR.value)
    from agentjax.train.policy import EXPORT_MARKER, Policy, export_refusal
    from agentjax.train.runtime import Runtime
    from agentjax.train.stages.rl import init_rl_state

    refusal = export_refusal(_OUT.value, lora=config.model.lora.rank > 0)
    if refusal:  # before the run's model is loaded
        print(f"error: --out={_OUT.value}: {refusal}", file=sys.stderr)
        sys.exit(2)
    runtime = Runtime.start(config, _WORKDIR.value, record_config=False, tracked=False)
    policy = Policy.load(config, runtime, texts=_no_texts, plan_memory=False)
    state = init_rl_state(config, policy.graphdef, policy.params)[0]
    checkpointer = runtime.checkpointer(runtime.workdir, read_only=True)
    try:
        step = _STEP.value if _STEP.value is not None else checkpointer.latest_step
        restored = None if step is None else checkpointer.restore(state, step)
    finally:
        checkpointer.close()
    if restored is None:
        raise FileNotFoundError(f"no RL checkpoint in {runtime.workdir}/checkpoints")
    marker = {"workdir": runtime.workdir, "step": step,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds")}
    # In the compute dtype, as the run's own exports (not the float32 training masters).
    policy.export(restored[0].params, _OUT.value,
                  extra_files={EXPORT_MARKER: json.dumps(marker, indent=1)})
    print(f"wrote {_OUT.value}")


def _no_texts():
    raise FileNotFoundError(f"{_WORKDIR.value}/init_model is missing: the run's own tiny "
                            "model cannot be rebuilt from a config alone")


if __name__ == "__main__":
    app.run(main)
