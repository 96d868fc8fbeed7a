"""Train an agent.

    python scripts/train.py --config configs/grpo_search.py
    python scripts/train.py --config configs/grpo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/run1

`--config file.py[:variant]` loads `get_config(variant)`; `--config.a.b=value` overrides
one key (unknown keys fail at once). `--workdir` defaults to runs/<config>-<variant>;
rerunning with the same workdir resumes the run exactly. A value no run can use stops
the script at once with `error: <the key, its value, what is allowed>` (exit status 2).
"""
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from agentjax.config import exit_on_config_error, renamed_in_flags, validate
from agentjax.config.preflight import MissingDependency, check_runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run folder (resumes if it has checkpoints)")
flags.mark_flags_as_required(["config"])


def default_workdir(config_arg: str) -> str:
    path, _, variant = config_arg.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join("runs", f"{name}-{variant}" if variant else name)


def enable_compilation_cache() -> None:
    """Reuses compiled XLA programs across runs (resumes, sweeps, evaluations)."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          os.path.join(os.path.expanduser("~"), ".cache", "agentjax", "xla"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


@exit_on_config_error
def main(argv):
    del argv
    validate(_CONFIG.value)  # before the trainer's imports and the task suite
    try:
        check_runtime(_CONFIG.value)
    except MissingDependency as error:
        fail(error, status=2)
    logging.set_verbosity(logging.WARNING)
    enable_compilation_cache()
    from agentjax.engine.protocol import EnginesUnavailable
    from agentjax.sglang.launch import ServerStartError
    from agentjax.train.episodes import EpisodesFailed
    from agentjax.train.fit import TrainingDiverged
    from agentjax.train.run import run

    workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
    try:
        run(_CONFIG.value, workdir)
    except (EpisodesFailed, TrainingDiverged, EnginesUnavailable,
            ServerStartError) as error:  # the run says why it stopped
        fail(error, status=1)


def parse_flags(argv):
    """absl's flag parsing, with an override of a key the config does not have (which
    ml_collections raises as AttributeError or KeyError) as one error line."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as error:
        renamed = renamed_in_flags(argv, error)
        if renamed:
            fail(renamed, status=2)
        message = str(error)
        keys = [a[len("--config."):].split("=")[0] for a in argv[1:]
                if a.startswith("--config.")]
        # The message names the first part of the key path that does not exist.
        unknown = [k for k in keys if any(re.search(rf"\b{re.escape(part)}\b", message)
                                          for part in k.split("."))]
        if not unknown:
            raise
        hint = re.search(r'Did you mean "(\w+)"', message)
        fail(f"unknown config key {unknown[0]!r}"
             + (f"; did you mean {hint.group(1)!r}?" if hint else "")
             + ("; --workdir is a flag of its own" if unknown[0] == "workdir" else ""),
             status=2)


def fail(error, *, status: int):
    print(f"error: {error}", file=sys.stderr)
    sys.exit(status)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
