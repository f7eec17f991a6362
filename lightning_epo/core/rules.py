"""What a setting may hold: a :class:`Rule` per config key, checked at start (lightning_epo/runtime/config.py).

A typed settings dataclass (e.g. :class:`lightning_epo.algos.settings.AlgoConfig`) gives each field its rule with
:func:`checked`; :func:`rules_of` reads them back as ``{dotted key: rule}``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING


@dataclass(frozen=True)
class Rule:
    """What a setting may hold: an integer, a number (int or float), a switch, one of named ``choices`` or a non-empty
    list of them (``names``); ``low`` / ``high`` bound a number (``open_low`` / ``open_high``: strictly);
    ``optional``: null is allowed too; ``example``: a valid value for the message."""

    kind: str  # "integer" | "number" | "bool" | "choice" | "names"
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    optional: bool = False
    example: object = None
    choices: tuple[str, ...] = ()
    registry: Any = None  # instead of ``choices``: a registry whose names are read when the value is checked

    def names(self) -> list[str]:
        """The valid choices (a registry's as registered now: a user's own estimator counts)."""
        return list(self.registry.names() if self.registry is not None else self.choices)

    def accepts(self, value: object) -> bool:
        """Whether ``value`` satisfies the rule (booleans are never numbers here: YAML's ``true`` is no 1)."""
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return value in self.names()
        if self.kind == "names":
            return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
                    and all(v in self.names() for v in value))
        types = (int,) if self.kind == "integer" else (int, float)
        if not isinstance(value, types) or isinstance(value, bool) or value != value:  # NaN fails every bound
            return False
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def describe(self) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ``true or false`` ... (+ ``or null``, + an example)."""
        if self.kind == "bool":
            text = "true or false (unquoted)"
        else:
            text = "an integer" if self.kind == "integer" else "a number"
            if self.low is not None and self.high is not None:
                text += f" in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
            elif self.low is not None:
                text += f" {'>' if self.open_low else '>='} {self.low:g}"
            elif self.high is not None:
                text += f" {'<' if self.open_high else '<='} {self.high:g}"
        if self.example is not None:
            text += f" (e.g. {self.example})"
        return text + (" or null" if self.optional else "")

    def error(self, key: str, value: object) -> str:
        """The one line that refuses ``value`` for ``key`` and names what it may be."""
        if self.kind == "choice":
            return f"{key}={value!r} is not valid; choose one of: {', '.join(self.names())}"
        if self.kind == "names":
            listed = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
            unknown = [v for v in listed if v not in self.names()] if listed else None
            what = (f"names unknown {', '.join(map(str, unknown))}" if unknown else "is empty" if listed is not None
                    else f"must be a list, got {value!r}")
            return f"{key} {what}: give a list of names from: {', '.join(self.names())}" + (
                " (or null for all)" if self.optional else "")
        return f"{key} must be {self.describe()}, got {value!r}"


def integer(minimum: int = 1, maximum: int | None = None, optional: bool = False) -> Rule:
    """An integer in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    return Rule("integer", low=minimum, high=maximum, optional=optional)


def number(low: float | None = None, high: float | None = None, open_low: bool = False, open_high: bool = False,
           optional: bool = False, example: object = None) -> Rule:
    """A number (int or float) within the given bounds."""
    return Rule("number", low, high, open_low, open_high, optional, example)


def one_of(*choices: str) -> Rule:
    """One of the named ``choices``."""
    return Rule("choice", choices=choices)


def names_of(registry: Any, optional: bool = False) -> Rule:
    """A non-empty list of names in ``registry`` (anything with ``names()``), e.g. a suite's task subset."""
    return Rule("names", registry=registry, optional=optional)


def registered(registry: Any) -> Rule:
    """One of the names in ``registry`` (a :class:`lightning_epo.algos.registry.Registry`) when the value is checked."""
    return Rule("choice", registry=registry)


SWITCH = Rule("bool")
POSITIVE = number(0, open_low=True)
NON_NEGATIVE = number(0)
FRACTION = number(0, 1)          # [0, 1]
TEMPERATURE = number(0, example="1.0; 0 is greedy")
TOP_P = number(0, 1, open_low=True)


def checked(rule: Rule) -> Any:
    """A dataclass field whose value the config gives (no default here) and that ``rule`` checks."""
    return dataclasses.field(default=MISSING, metadata={"rule": rule})


def _dataclass_in(annotation: object) -> type | None:
    """The dataclass an annotation names, alone or as ``X | None``."""
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def rules_of(schema: type, prefix: str) -> dict[str, Rule]:
    """``{prefix.field: rule}`` for every field of the dataclass ``schema`` (and of the dataclasses it nests)
    that :func:`checked` gave a rule."""
    rules: dict[str, Rule] = {}
    for name, annotation in typing.get_type_hints(schema).items():
        field = schema.__dataclass_fields__[name]
        if "rule" in field.metadata:
            rules[f"{prefix}.{name}"] = field.metadata["rule"]
        elif (nested := _dataclass_in(annotation)) is not None:
            rules |= rules_of(nested, f"{prefix}.{name}")
    return rules
