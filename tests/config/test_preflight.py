"""Missing dependencies fail in a run's first seconds, naming the install command."""
import importlib
import importlib.metadata
import importlib.util

import pytest

from agentjax.config import preflight
from agentjax.config import default_config


def _hide_module(monkeypatch, hidden: str):
    real_import = importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name == hidden:
            raise ImportError(f"No module named {hidden!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake_import)


def test_everything_present_passes():
    preflight.check_runtime(default_config())


def test_missing_jinja2_fails_with_the_install_command(monkeypatch):
    _hide_module(monkeypatch, "jinja2")
    with pytest.raises(preflight.MissingDependency, match="jinja2.*pip install -e"):
        preflight.check_runtime(default_config())


def test_missing_declared_distribution_is_named(monkeypatch):
    real_version = importlib.metadata.version

    def version(name):
        if name == "bm25s":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(preflight.MissingDependency, match="'bm25s'"):
        preflight.check_runtime(default_config())


def test_lazily_imported_modules_are_declared_requirements():
    """A module the run imports late must be one `pip install -e .` installs."""
    declared = {name.lower().replace("_", "-") for name in preflight._distributions()}
    config = default_config()
    config.data.source, config.retrieval.kind = "files", "http"
    for module in preflight.lazy_modules(config):
        assert module.lower() in declared, f"{module} is not in pyproject's dependencies"


@pytest.mark.parametrize("env", ["python", "code"])
@pytest.mark.parametrize("root", [True, False])
def test_sandboxed_envs_need_bubblewrap_and_util_linux(monkeypatch, env, root):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    monkeypatch.setattr(preflight.os, "geteuid", lambda: 0 if root else 1000)
    config = default_config()
    config.env.name = env
    with pytest.raises(preflight.MissingDependency) as error:
        preflight.check_runtime(config)
    message = str(error.value)
    assert "bwrap, prlimit" + (", setpriv" if root else ".") in message
    assert message.endswith("apt-get install -y bubblewrap util-linux")
    # Only what is missing is named.
    monkeypatch.setattr(preflight.shutil, "which",
                        lambda name: None if name == "setpriv" else f"/usr/bin/{name}")
    if root:
        with pytest.raises(preflight.MissingDependency, match=r"found on PATH: setpriv\. "
                                                               r"Install with: apt-get "
                                                               r"install -y util-linux$"):
            preflight.check_runtime(config)
    else:
        preflight.check_runtime(config)


@pytest.mark.parametrize("key, value, module, install", [
    ("wandb.mode", "offline", "wandb", "pip install wandb"),
    ("mlflow.tracking_uri", "file:/tmp/mlruns", "mlflow", "pip install mlflow-skinny")])
def test_a_tracker_without_its_package_is_one_setup_line_naming_the_install(
        monkeypatch, key, value, module, install):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == module else real_find_spec(name, *a))
    config = default_config()
    section, name = key.split(".")
    config.log[section][name] = value
    with pytest.raises(preflight.MissingDependency) as error:
        preflight.check_runtime(config)
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"Install with: {install}")
    assert f"module {module!r}, needed by log.{section}." in message
    preflight.check_runtime(default_config())  # off: not needed
