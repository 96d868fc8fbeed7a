"""One registry per extension point: env suites, tools, reward components, policy-loss
kinds, advantage estimators, rollout sources, rollout-trainer mismatch masks.

    POLICY_LOSSES = Registry("policy loss kind")

    @POLICY_LOSSES.register("ppo")
    def ppo(...): ...

    POLICY_LOSSES.get("ppo")      # an unknown name raises naming the registered ones

The names a config may choose are also listed, import-light, in `agentjax.config.choices`
(validation runs before jax is imported); a test checks each list against its registry.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> implementations of one extension point, filled by `register`."""

    def __init__(self, what: str):
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: registers its target under `name` (a name registers once)."""

        def add(target: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = target
            return target

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
