"""Checks, in a run's first seconds, that everything the run will need later is there.

Some dependencies are only imported deep inside a run: transformers imports jinja2 the
first time it renders a chat template (the first demonstration, after minutes of
pretraining), tensorboardX when the first metrics row is written, pyarrow when a parquet
file is read, bubblewrap when the first Python tool call runs. A missing one must fail
before any work, with the command that installs it. The trackers' packages (wandb,
mlflow) and the MCP SDK are no requirement of agentjax: a run that turns one on
without it installed fails here the same way.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil

from agentjax.config.choices import task_env

INSTALL = "pip install -e .  (from the agentjax checkout)"


class MissingDependency(RuntimeError):
    """A package or program the configured run needs is not installed."""


def _distributions() -> list[str]:
    """The runtime distributions agentjax declares (its install requirements)."""
    try:
        requires = importlib.metadata.requires("agentjax") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return []
    names = []
    for requirement in requires:
        if "extra ==" in requirement:
            continue
        name = requirement.split(";")[0]
        for separator in "<>=!~[ ":
            name = name.split(separator)[0]
        names.append(name.strip())
    return names


def lazy_modules(config) -> dict[str, str]:
    """{module: what needs it} for the modules this run imports only when it gets there."""
    needed = {"jinja2": "chat templates (transformers renders them with jinja2)"}
    if config.log.tensorboard:
        needed["tensorboardX"] = "log.tensorboard=True"
    if config.data.source == "files":
        needed["pyarrow"] = "data.source='files' (parquet)"
    if config.retrieval.kind == "http":
        needed["httpx"] = "retrieval.kind='http'"
    return needed


def optional_modules(config) -> dict[str, tuple[str, str]]:
    """{module: (what needs it, the command that installs it)} for the packages agentjax
    does not require that this run uses (the trackers')."""
    needed = {}
    if config.log.wandb.mode != "disabled":
        needed["wandb"] = (f"log.wandb.mode={config.log.wandb.mode!r}", "pip install wandb")
    if config.log.mlflow.tracking_uri:
        needed["mlflow"] = ("log.mlflow.tracking_uri", "pip install mlflow-skinny")
    if config.env.mcp_servers:
        # envs/mcp.py is written against the 2.x API (its SDK_RANGE); the suite checks
        # the installed version when it starts the servers.
        needed["mcp"] = ("env.mcp_servers", "pip install 'mcp>=2.3,<3'")
    return needed


# Envs whose tools run the policy's code in agentjax.envs.sandbox.
SANDBOXED_ENVS = ("python", "code")


def check_runtime(config) -> None:
    """Raises MissingDependency naming what is missing and how to install it."""
    missing, commands = [], []
    for name in _distributions():
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"package {name!r} (an agentjax requirement)")
    for module, reason in lazy_modules(config).items():
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing.append(f"module {module!r}, needed by {reason} ({error})")
    if missing:
        commands.append(INSTALL)
    for module, (reason, install) in optional_modules(config).items():
        if importlib.util.find_spec(module) is None:
            missing.append(f"module {module!r}, needed by {reason}")
            commands.append(install)
    if missing:
        raise MissingDependency("missing " + "; ".join(missing) + ". Install with: "
                                + " and ".join(commands))
    if task_env(config) in SANDBOXED_ENVS:
        check_sandbox_tools(task_env(config))


def check_sandbox_tools(env_name: str) -> None:
    """Raises MissingDependency naming the sandbox's missing executables: bubblewrap,
    util-linux's prlimit, and its setpriv when we are root (the sandbox drops to a
    dedicated uid with it)."""
    needed = {"bwrap": "bubblewrap", "prlimit": "util-linux"}
    if os.geteuid() == 0:
        needed["setpriv"] = "util-linux"
    missing = [name for name in needed if shutil.which(name) is None]
    if missing:
        packages = " ".join(dict.fromkeys(needed[name] for name in missing))
        raise MissingDependency(
            f"env.name={env_name!r} runs the policy's code under bubblewrap with rlimits; "
            f"not found on PATH: {', '.join(missing)}. Install with: apt-get install -y "
            f"{packages}")
