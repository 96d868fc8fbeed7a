"""What a config key may hold: the kinds of rule (Integer, Real, Choice, Flag, Text,
Path) and the rules several keys share; and what a key may do when a run resumes
(Fixed, Free, Grows).

A rule answers `allows(value)` and says in words what it allows (`allowed`), which a
ConfigError quotes. A number rule never allows NaN or an infinity; a rule allows only its
own type (True is not an integer here, 1 is not a flag).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Callable, Protocol

from agentjax.config.choices import LORA_TARGETS, ROLLOUT_CORRECTION_MASKS


class Rule(Protocol):
    """What a key allows: `allows(value)`, and `allowed`, the same in words."""

    allowed: str

    def allows(self, value) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Integer:
    """An integer >= low (and <= high unless None), or one of `special`: (value, what it
    means) pairs."""

    low: int
    high: int | None = None
    special: tuple[tuple[int, str], ...] = ()

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        in_range = value >= self.low and (self.high is None or value <= self.high)
        return in_range or value in dict(self.special)

    @property
    def allowed(self) -> str:
        bounds = (f"an integer >= {self.low}" if self.high is None
                  else f"an integer in [{self.low}, {self.high}]")
        return ", or ".join([bounds] + [f"{v} ({meaning})" for v, meaning in self.special])


@dataclasses.dataclass(frozen=True)
class Real:
    """A finite number in `interval`, written "[0, 1)" / "(0, inf)" (a bracket includes
    its bound, a parenthesis excludes it; inf is never included), or one of `special`.
    NaN and infinities are never allowed."""

    interval: str
    special: tuple[tuple[float, str], ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"[\[(][^,]+, [^,]+[\])]", self.interval):
            raise ValueError(f"Real interval {self.interval!r} is not like '[0, 1)'")

    @property
    def bounds(self) -> tuple[float, float]:
        low, high = self.interval[1:-1].split(", ")
        return float(low), float(high)

    @property
    def closed(self) -> tuple[bool, bool]:
        return self.interval[0] == "[", self.interval[-1] == "]"

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if value in dict(self.special):
            return True
        (low, high), (low_closed, high_closed) = self.bounds, self.closed
        above = value >= low if low_closed else value > low
        below = value <= high if high_closed else value < high
        return above and below

    @property
    def allowed(self) -> str:
        return ", or ".join([f"a finite number in {self.interval}"]
                            + [f"{v} ({meaning})" for v, meaning in self.special])


@dataclasses.dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def allows(self, value) -> bool:
        return value in self.options

    @property
    def allowed(self) -> str:
        return f"one of {list(self.options)}"


@dataclasses.dataclass(frozen=True)
class Flag:
    def allows(self, value) -> bool:
        return isinstance(value, bool)

    allowed = "True or False"


@dataclasses.dataclass(frozen=True)
class Text:
    """A string `check` accepts; `allowed` says which in words."""

    allowed: str
    check: Callable[[str], bool]

    def allows(self, value) -> bool:
        return isinstance(value, str) and self.check(value)


@dataclasses.dataclass(frozen=True)
class Path:
    """"" (none) or an existing `kind` ("folder" or "file") on this machine."""

    kind: str
    what: str

    def allows(self, value) -> bool:
        exists = os.path.isdir if self.kind == "folder" else os.path.isfile
        return isinstance(value, str) and (value == "" or exists(value))

    @property
    def allowed(self) -> str:
        return f"'' or an existing {self.kind} ({self.what})"


def _entries(text: str) -> list[tuple[str, str]] | None:
    """"1:400, 2:0.5" -> [("1", "400"), ("2", "0.5")]; None when an entry lacks its ':'."""
    parts = [p.strip() for p in text.split(",")]
    if not all(":" in p for p in parts):
        return None
    return [tuple(s.strip() for s in p.split(":", 1)) for p in parts]


def _hop_counts(text: str) -> bool:
    entries = _entries(text)
    return bool(entries) and all(
        hops in ("1", "2", "3", "4") and count.isdigit() for hops, count in entries
    ) and sum(int(count) for _, count in entries) > 0


def _hop_fractions(text: str) -> bool:
    if text == "":
        return True
    entries = _entries(text)

    def fraction(value: str) -> bool:
        try:
            return 0.0 <= float(value) <= 1.0
        except ValueError:
            return False

    return bool(entries) and all(hops in ("1", "2", "3", "4") and fraction(value)
                                 for hops, value in entries)


def chunk_widths(text: str) -> tuple[int, ...]:
    """"16,64,256" -> (16, 64, 256): prefill chunk widths; ValueError unless every entry
    is an integer >= 1."""
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: give comma-separated widths like 16,64,256") from None
    if min(widths) < 1:
        raise ValueError(f"{text!r}: widths must be >= 1")
    return widths


def _chunk_widths(text: str) -> bool:
    try:
        chunk_widths(text)
    except ValueError:
        return False
    return True


def _json_object(text: str) -> bool:
    if text == "":
        return True
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _url(text: str) -> bool:
    return re.fullmatch(r"https?://[^\s,]+", text) is not None


def _name(text: str) -> bool:
    return text == "" or re.fullmatch(r"\S+", text) is not None


def _host_port(text: str) -> bool:
    return text == "" or re.fullmatch(r"[^\s:]+:\d+", text) is not None


def _tags(text: str) -> bool:
    return text == "" or all(0 < len(tag.strip()) <= 64 for tag in text.split(","))


def _tracking_uri(text: str) -> bool:
    return text in ("", "databricks") or re.fullmatch(r"[a-z][a-z0-9+.-]*:\S+", text) is not None


def _distinct_names(text: str, names: tuple[str, ...]) -> bool:
    """`text` is comma-separated names among `names`, each once."""
    parts = [part.strip() for part in text.split(",")]
    return all(part in names for part in parts) and len(set(parts)) == len(parts)


def _lora_targets(text: str) -> bool:
    return _distinct_names(text, LORA_TARGETS)


HOP_COUNTS = Text("comma-separated 'hops:count' entries (hops 1..4, counts >= 0, "
                  "at least one question), e.g. '1:400,2:400'", _hop_counts)
HOP_FRACTIONS = Text("'' (demonstrate every training question) or comma-separated "
                     "'hops:fraction' entries (hops 1..4, fractions in [0, 1]), e.g. "
                     "'1:0.85,2:0.85'", _hop_fractions)
JSON_OBJECT = Text("'' or a JSON object of logical axis -> mesh axes, e.g. "
                   "'{\"embed\": null}'", _json_object)
URL = Text("'' or an http(s):// URL", lambda text: text == "" or _url(text))
URLS = Text("'' or comma-separated http(s):// URLs",
            lambda text: text == "" or all(_url(u.strip()) for u in text.split(",")))
TEMPLATE_KWARGS = Text("'' or a JSON object of chat-template variables, e.g. "
                       "'{\"enable_thinking\": false}'", _json_object)
HOST_PORT = Text("'' or 'host:port'", _host_port)
FOLDER_TO_CREATE = Text("'' or a folder path (created if missing)",
                        lambda text: "\0" not in text)
LORA_TARGET_LIST = Text("comma-separated projections, each once, among q, k, v, o, gate, "
                        "up, down, e.g. 'q,k,v,o,gate,up,down'", _lora_targets)
CORRECTION_MASK_LIST = Text(
    "'' (none) or comma-separated masks, each once, among "
    f"{', '.join(ROLLOUT_CORRECTION_MASKS)}, e.g. 'geometric' or 'token,opsm'",
    lambda text: text == "" or _distinct_names(text, ROLLOUT_CORRECTION_MASKS))
CHUNK_WIDTHS = Text("comma-separated widths >= 1, e.g. '16,64,256'", _chunk_widths)
ONE_LINE = Text("one line of text", lambda text: "\n" not in text)
NAME = Text("a name: no whitespace, '/', '\\', '#', '?', '%' or ':'",
            lambda text: re.fullmatch(r"[^\s/\\#?%:]+", text) is not None)
NAME_OR_DEFAULT = Text("'' (the login's default) or a name: no whitespace, '/', '\\', "
                       "'#', '?', '%' or ':'", lambda text: text == "" or NAME.allows(text))
TITLE = Text("a non-empty line of text",
             lambda text: text.strip() != "" and ONE_LINE.allows(text))
TAGS = Text("'' or comma-separated tags of 1 to 64 characters each", _tags)
TRACKING_URI = Text("'' (off) or a tracking URI with its scheme: file:<folder>, "
                    "http(s)://host:port, sqlite:///<file>, databricks", _tracking_uri)
SERVED_MODEL = Text("'' or the model name a server serves (no whitespace)", _name)

# The ranges most keys share.
POSITIVE = Integer(1)
COUNT = Integer(0)
PROBABILITY = Real("[0, 1]")
NON_NEGATIVE = Real("[0, inf)")
POSITIVE_REAL = Real("(0, inf)")
ANY_REAL = Real("(-inf, inf)")


class OnResume(Protocol):
    """What a key may do when a run resumes (config/resume.py compares the config in
    effect in the workdir with the rerun's): `refusal(old, new, config)` is None when
    the change leaves the experiment as it was, else why not ("" when the key simply
    defines it)."""

    def refusal(self, old, new, config) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class Fixed:
    """The key defines the experiment: a resumed run keeps it (unless the change is
    accepted by name, --allow_config_change)."""

    def refusal(self, old, new, config) -> str | None:
        return ""


@dataclasses.dataclass(frozen=True)
class Free:
    """How the run is watched, saved or served, never what it trains: free to change
    on resume."""

    def refusal(self, old, new, config) -> str | None:
        return None


@dataclasses.dataclass(frozen=True)
class Grows:
    """A length that may grow on resume, while `depends(config)` names nothing the
    length is part of (a schedule over it); None when nothing is."""

    depends: Callable[..., str | None]

    def refusal(self, old, new, config) -> str | None:
        if new < old:
            return "it may only grow on resume"
        return self.depends(config)


FIXED, FREE = Fixed(), Free()
