"""The schema: every key is defined once with its default, its rule and what it means;
every value outside a key's rule is a one-line ConfigError naming the key."""
import math
import os

import ml_collections
import pytest

from agentjax import config as config_lib
from agentjax.config import mcp_servers, rules, schema
from agentjax.config.rules import Integer, Real
from agentjax.config.validation import leaves
from agentjax.models.tokenizer import build_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT = config_lib.default_config()
KEYS = [key for key, _, _ in leaves(DEFAULT, DEFAULT)]
MISSING = "/nonexistent/agentjax-config-test"

# Strings each format rule must reject.
BAD_TEXT = {
    rules.HOP_COUNTS: ["", "1", "5:10", "1:-2", "1:x", "1:0,2:0", "1:400;2:400"],
    rules.HOP_FRACTIONS: ["1", "1:1.5", "5:0.5", "1:x", "1:-0.1"],
    rules.JSON_OBJECT: ["[1]", "{", "null"],
    rules.TEMPLATE_KWARGS: ["{enable_thinking: false}", "[1]", "true"],
    rules.URL: ["localhost:8000", "ftp://host/x", "http://a b"],
    rules.URLS: ["http://a,localhost:1", "http://a,"],
    rules.LORA_TARGET_LIST: ["", "q,qkv", "q,q", "q;k", "Q"],
    rules.CORRECTION_MASK_LIST: ["icepop", "token,token", "geometric;opsm", "token,",
                                 "Geometric"],
    rules.HOST_PORT: ["host", "host:port", "host:1:2"],
    rules.SERVED_MODEL: ["judge 7b", " "],
    rules.FOLDER_TO_CREATE: ["runs/\0weights"],
    rules.ONE_LINE: ["two\nlines"],
    rules.CHUNK_WIDTHS: ["", "16,", "16;64", "0,16", "-16", "1.5", "x"],
    rules.NAME: ["", "my project", "team/project", "a:b"],
    rules.NAME_OR_DEFAULT: ["my team", "a/b"],
    rules.TITLE: ["", "  ", "two\nlines"],
    rules.TAGS: [",", "a,,b", "x" * 65],
    rules.TRACKING_URI: ["./mlruns", "mlruns", "file:", "http://a b"],
    mcp_servers.MCP_SERVERS: ["{", "{}", '[{"name": "a"}]', '[{"name": "a", "url": "x"}]'],
}


def outside(rule) -> list:
    """Values `rule` must reject (wrong types included)."""
    if isinstance(rule, Integer):
        values = [min([rule.low] + [v for v, _ in rule.special]) - 1, 1.5, True, "1"]
        return values + ([] if rule.high is None else [rule.high + 1])
    if isinstance(rule, Real):
        values = [math.nan, math.inf, -math.inf, "0.5", True]
        (low, high), (low_closed, high_closed) = rule.bounds, rule.closed
        special = dict(rule.special)
        for bound, closed, step in ((low, low_closed, -1), (high, high_closed, 1)):
            if math.isfinite(bound):
                values += [v for v in (bound + step, None if closed else bound)
                           if v is not None and v not in special]
        return values
    if isinstance(rule, rules.Choice):
        return ["no-such-option", 1]
    if isinstance(rule, rules.Flag):
        return ["yes", 1]
    if isinstance(rule, rules.Path):
        # A folder where a file is wanted and the other way round, and a missing path.
        return [MISSING, __file__ if rule.kind == "folder" else ROOT]
    return BAD_TEXT[rule]


def _with(key: str, value) -> ml_collections.ConfigDict:
    """The default config with `key` set to `value` as a json file could set it (no
    ConfigDict type safety: validate() must catch wrong types itself)."""
    values = DEFAULT.to_dict()
    *sections, name = key.split(".")
    node = values
    for section in sections:
        node = node[section]
    node[name] = value
    return ml_collections.ConfigDict(values)


def _error(config) -> str:
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.validate(config)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_every_key_of_the_default_config_has_exactly_one_rule():
    """default_config() and RULES are both derived from the schema's keys."""
    assert sorted(config_lib.RULES) == sorted(KEYS)
    assert len(KEYS) == len(set(KEYS)) == len(schema.KEYS)


def test_every_key_is_defined_once_with_its_default_rule_and_meaning():
    defined = [f"{s.name}.{k.name}" if s.name else k.name
               for s in schema.SECTIONS for k in s.keys]
    assert len(defined) == len(set(defined))
    assert sorted(defined) == sorted(KEYS)
    for section in schema.SECTIONS:
        assert section.doc, section.name
        for key in section.keys:
            dotted = f"{section.name}.{key.name}" if section.name else key.name
            assert key.doc.strip(), dotted
            assert config_lib.RULES[dotted] is key.rule
            value = DEFAULT
            for name in dotted.split("."):
                value = value[name]
            assert value == key.default and type(value) is type(key.default), dotted
            assert key.rule.allows(key.default), dotted


def test_a_key_defined_twice_is_refused(monkeypatch):
    twice = schema.Section("env", "twice", schema.Key("topk", 1, rules.POSITIVE, "again"))
    monkeypatch.setattr(schema, "SECTIONS", schema.SECTIONS + (twice,))
    with pytest.raises(ValueError, match="'env.topk' is defined twice"):
        schema._keys()


def test_the_default_config_is_locked():
    with pytest.raises(AttributeError, match="mask_observations"):
        config_lib.default_config().env.mask_observations = True


def test_every_text_rule_has_bad_examples():
    text_rules = {rule for rule in config_lib.RULES.values() if isinstance(rule, rules.Text)}
    assert text_rules <= set(BAD_TEXT)


def test_the_defaults_and_every_rules_boundaries_are_allowed():
    config_lib.validate(config_lib.default_config())
    for key, rule in config_lib.RULES.items():
        if isinstance(rule, Integer):
            inside = [rule.low] + [v for v, _ in rule.special]
            inside += [] if rule.high is None else [rule.high]
        elif isinstance(rule, Real):
            (low, high), (low_closed, high_closed) = rule.bounds, rule.closed
            inside = [v for v, _ in rule.special] + ([low] if low_closed else []) + (
                [high] if high_closed and math.isfinite(high) else [])
        else:
            continue
        for value in inside:
            assert rule.allows(value), (key, value)


@pytest.mark.parametrize("key", KEYS)
def test_a_value_outside_its_range_is_an_error_naming_the_key(key):
    for value in outside(config_lib.RULES[key]):
        message = _error(_with(key, value))
        assert message.startswith(f"config key {key!r} is {value!r}"), message


def test_nan_and_infinity_are_rejected_for_every_float_key():
    float_keys = [key for key, ref, _ in leaves(DEFAULT, DEFAULT) if isinstance(ref, float)]
    assert "optim.lr" in float_keys
    for key in float_keys:
        for value in (math.nan, math.inf):
            assert f"config key {key!r}" in _error(_with(key, value))


def test_the_smallest_allowed_vocabulary_builds_a_tokenizer():
    build_tokenizer(["a b c"], vocab_size=schema.MIN_TINY_VOCAB)
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer(["a b c"], vocab_size=schema.MIN_TINY_VOCAB - 1)


def test_unknown_keys_and_wrong_types_name_the_key():
    config = config_lib.default_config()
    with pytest.raises(AttributeError, match="nme"):
        config.algo.nme = "x"
    with pytest.raises(TypeError, match="kl_coef"):
        config_lib.default_config().algo.kl_coef = "0.1"
    assert "algo.kl_coef" in _error(_with("algo.kl_coef", "0.1"))
    loose = ml_collections.ConfigDict(DEFAULT.to_dict())
    loose.algo.unknown_knob = 1
    assert "algo.unknown_knob" in _error(loose)
    assert "'algo'" in _error(_with("algo", 3))
