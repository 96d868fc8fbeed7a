"""Train an agent.

    python scripts/train.py --config configs/grpo_search.py
    python scripts/train.py --config configs/grpo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/run1

`--config file.py[:variant]` loads `get_config(variant)`; `--config.a.b=value` overrides
one key (unknown keys fail at once). `--workdir` defaults to runs/<config>-<variant>;
rerunning with the same workdir resumes the run exactly. A value no run can use stops
the script at once with `error: <the key, its value, what is allowed>` (exit status 2).

A rerun whose config changes a key that defines the experiment (the model, data,
algorithm, ...) stops the same way, naming each such key with both values; the keys of
`--allow_config_change=key1,key2` may change, and the change is recorded in
<workdir>/config_changes.jsonl (agentjax/config/resume.py). SIGTERM stops a run as
Ctrl-C does: pending checkpoint writes finish, servers and threads are closed (exit
status 143).
"""
import os
import re
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from agentjax.config import check_resume, exit_on_config_error, renamed_in_flags, validate
from agentjax.config.preflight import MissingDependency, check_runtime

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run folder (resumes if it has checkpoints)")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_list(
    "allow_config_change", [], "config keys a resume may change although they define the "
    "experiment, e.g. optim.lr,rollout.group_size (recorded in config_changes.jsonl)")
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
    workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
    # Before the trainer's imports and the task suite:
    validate(_CONFIG.value)
    check_resume(_CONFIG.value, workdir, _ALLOW_CONFIG_CHANGE.value)
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

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        run(_CONFIG.value, workdir, allow_config_change=_ALLOW_CONFIG_CHANGE.value)
    except (EpisodesFailed, TrainingDiverged, EnginesUnavailable,
            ServerStartError) as error:  # the run says why it stopped
        fail(error, status=1)


def stop_on_sigterm(signum, frame):
    """SIGTERM (a scheduler's stop, `kill`) raises SystemExit where the run is, so the
    run's `finally` blocks run as they do for Ctrl-C's KeyboardInterrupt."""
    del signum, frame
    sys.exit(128 + signal.SIGTERM)


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
