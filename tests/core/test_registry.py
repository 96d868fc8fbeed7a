"""The one registry every extension point uses."""
import pytest

from agentjax.core.registry import Registry


def test_registered_names_resolve_in_registration_order():
    kinds = Registry("policy loss kind")
    first = kinds.register("ppo")(lambda: "ppo")
    kinds.register("cispo")(lambda: "cispo")
    assert kinds.get("ppo") is first and kinds.get("cispo")() == "cispo"
    assert kinds.names() == ("ppo", "cispo") and list(kinds) == ["ppo", "cispo"]
    assert "ppo" in kinds and "gspo" not in kinds


def test_an_unknown_name_lists_the_registered_ones():
    kinds = Registry("advantage estimator")
    kinds.register("grpo")(object())
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gae'; registered: \['grpo'\]"):
        kinds.get("gae")


def test_a_name_registers_once():
    kinds = Registry("tool")
    kinds.register("python")(object())
    with pytest.raises(ValueError, match="tool 'python' is already registered"):
        kinds.register("python")(object())
