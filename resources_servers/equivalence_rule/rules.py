"""The equivalence rules of equivalence_rule: is an answer equivalent to a reference, and by which rule?

`equivalent(answer, reference, options, units)` tries, in this order, the rules that `options.rules` enables:

1. `exact`: equal after stripping surrounding whitespace;
2. numbers, when both sides read as numbers (then nothing else decides: "-3" never equals "3" as text):
   `numeric` (plain numbers within tolerance: `1,234`, `-0.5`, `1e3`), `fraction_decimal` (a fraction on
   either side: `3/4`, `\\frac{3}{4}`, `1 1/2`, vs `0.75`), `percentage` (`20%` vs `0.2`, or vs `20` when
   `percent_accepts_bare_number`), `units` (quantities converted by pint: `1.5 km` vs `1500 m`);
3. `boolean`: both are yes/no words (yes, true, correct, y / no, false, incorrect, n);
4. `normalized_text`: equal after SQuAD-style normalization (case, punctuation, articles, whitespace);
5. `unordered_list` (or `ordered_list` with `ordered_lists`): both are lists of 2+ items (`a, b`, `[a; b]`,
   `{a and b}`) of the same length whose items pair up one-to-one under rules 1-4.

Numbers are exact `Fraction`s until the tolerance check: `math.isclose(a, b, rel_tol, abs_tol)`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from enum import Enum
from fractions import Fraction
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.env.answers import normalize_text


class Rule(str, Enum):
    """The name of a rule, as reported in `matched_rule`."""

    EXACT = "exact"
    NUMERIC = "numeric"
    FRACTION_DECIMAL = "fraction_decimal"
    PERCENTAGE = "percentage"
    UNITS = "units"
    BOOLEAN = "boolean"
    NORMALIZED_TEXT = "normalized_text"
    UNORDERED_LIST = "unordered_list"
    ORDERED_LIST = "ordered_list"


class RuleOptions(BaseModel):
    """Which rules apply and their tolerances (server defaults; a row's `equivalence` overrides some)."""

    model_config = ConfigDict(extra="forbid")
    rules: list[Rule] = Field(default_factory=lambda: list(Rule), description="the rules that may decide equivalence")
    abs_tol: float = Field(0.0, ge=0, description="absolute tolerance of numeric comparisons")
    rel_tol: float = Field(1e-6, ge=0, description="relative tolerance of numeric comparisons")
    ordered_lists: bool = Field(
        False, description="lists must be in the same order (ordered_list) instead of any order"
    )
    percent_accepts_bare_number: bool = Field(True, description="`20%` also matches a bare `20` (the sign left out)")
    max_list_items: int = Field(50, gt=1, description="longer lists are not compared")


BOOLEANS = {
    **dict.fromkeys(("yes", "y", "true", "t", "correct", "right"), True),
    **dict.fromkeys(("no", "n", "false", "f", "incorrect", "wrong"), False),
}
TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm)\{(.*)\}$", flags=re.DOTALL)
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?"
PLAIN_NUMBER = re.compile(rf"{NUMBER}")
FRACTION = re.compile(r"(?P<sign>[-+]?)(?:(?P<whole>\d+)\s+)?(?P<num>\d+)\s*/\s*(?P<den>\d+)")
LATEX_FRACTION = re.compile(r"(?P<sign>[-+]?)\\[dt]?frac\{\s*(?P<num>\d+)\s*\}\{\s*(?P<den>\d+)\s*\}")
PERCENT = re.compile(rf"(?P<value>{NUMBER})\s*(?:\\?%|percent)")
QUANTITY = re.compile(rf"(?P<value>{NUMBER})\s*(?P<unit>[^\d\s.,;].*)")
LIST_SPLIT = re.compile(r"\s*(?:[,;]|\band\b)\s*")
BRACKETS = ("[]", "()", "{}", "\\{\\}")


def clean(text: str) -> str:
    """NFKC, Unicode minus as `-`, `$` and `\\text{...}` wrappers removed, outer whitespace and a final full stop dropped."""  # noqa: E501
    text = unicodedata.normalize("NFKC", text).replace("\u2212", "-").strip().replace("\\$", "$").strip("$").strip()
    while (m := TEXT_WRAPPER.match(text)) is not None:
        text = m.group(1).strip()
    return text.removesuffix(".").strip()


def parse_plain_number(text: str) -> Fraction | None:
    """`-1,234.5`, `.5`, `1e3` as an exact Fraction; None for anything else."""
    if not re.search(r"\d", text) or PLAIN_NUMBER.fullmatch(text) is None:
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def parse_fraction(text: str) -> Fraction | None:
    """`3/4`, `-1 1/2`, `\\frac{3}{4}` as a Fraction; None for anything else (or a zero denominator)."""
    m = FRACTION.fullmatch(text) or LATEX_FRACTION.fullmatch(text)
    if m is None or int(m.group("den")) == 0:
        return None
    value = int(m.groupdict().get("whole") or 0) + Fraction(int(m.group("num")), int(m.group("den")))
    return -value if m.group("sign") == "-" else value


def parse_percent(text: str) -> Fraction | None:
    """`20%`, `20 %`, `20\\%`, `20 percent` as the number before the sign (20); None for anything else."""
    m = PERCENT.fullmatch(text)
    return parse_plain_number(m.group("value")) if m else None


def parse_quantity(text: str, units: Any) -> Any | None:
    """`1.5 km`, `30 km/h`, `20 °C` as a pint Quantity of the registry `units`; None for anything else."""
    m = QUANTITY.fullmatch(text)
    if m is None or units is None or (value := parse_plain_number(m.group("value"))) is None:
        return None
    try:
        unit = units.parse_units(m.group("unit").strip())
    except Exception:  # pint raises several error types on unknown or malformed unit text
        return None
    return units.Quantity(float(value), unit) if not unit.dimensionless else None


def close(a: Fraction | float, b: Fraction | float, options: RuleOptions) -> bool:
    return a == b or math.isclose(float(a), float(b), rel_tol=options.rel_tol, abs_tol=options.abs_tol)


def numeric_rule(answer: str, reference: str, options: RuleOptions, units: Any) -> tuple[bool, Rule | None]:
    """(both sides are numbers, the rule that finds them equal or None)."""
    plain = [parse_plain_number(s) for s in (answer, reference)]
    fraction = [parse_fraction(s) for s in (answer, reference)]
    percent = [parse_percent(s) for s in (answer, reference)]
    values = [p if p is not None else f for p, f in zip(plain, fraction)]
    if all(v is not None for v in values):
        rule = Rule.NUMERIC if all(p is not None for p in plain) else Rule.FRACTION_DECIMAL
        return True, rule if close(values[0], values[1], options) else None
    if any(p is not None for p in percent) and all(v is not None or p is not None for v, p in zip(values, percent)):
        if all(p is not None for p in percent):
            return True, Rule.PERCENTAGE if close(percent[0], percent[1], options) else None
        pct, other = (percent[0], values[1]) if percent[0] is not None else (percent[1], values[0])
        equal = close(other, pct / 100, options) or (options.percent_accepts_bare_number and close(other, pct, options))
        return True, Rule.PERCENTAGE if equal else None
    quantities = [parse_quantity(s, units) for s in (answer, reference)]
    if all(q is not None for q in quantities):
        a, r = quantities
        same = a.dimensionality == r.dimensionality and close(a.to(r.units).magnitude, r.magnitude, options)
        return True, Rule.UNITS if same else None
    return False, None  # one side at most is a number: the text rules decide


def scalar_rule(answer: str, reference: str, options: RuleOptions, units: Any) -> Rule | None:
    """The first enabled rule (1-4 of the module docstring) that finds `answer` equivalent to `reference`."""
    enabled = set(options.rules)
    if Rule.EXACT in enabled and answer.strip() == reference.strip():
        return Rule.EXACT
    answer, reference = clean(answer), clean(reference)
    both_numbers, rule = numeric_rule(answer, reference, options, units if Rule.UNITS in enabled else None)
    if both_numbers:
        return rule if rule in enabled else None
    booleans = [BOOLEANS.get(normalize_text(s)) for s in (answer, reference)]
    if None not in booleans:
        return Rule.BOOLEAN if Rule.BOOLEAN in enabled and booleans[0] == booleans[1] else None
    if Rule.NORMALIZED_TEXT in enabled and normalize_text(answer) == normalize_text(reference) != "":
        return Rule.NORMALIZED_TEXT
    return None


def split_list(text: str, max_items: int) -> list[str] | None:
    """The items of a list of 2+ items (outer brackets removed; `,` `;` `and` separate); None otherwise."""
    text = clean(text)
    for pair in BRACKETS:
        half = len(pair) // 2
        if text.startswith(pair[:half]) and text.endswith(pair[half:]):
            text = text[half:-half]
            break
    items = [item for item in LIST_SPLIT.split(text) if item.strip()]
    return items if 2 <= len(items) <= max_items else None


def pair_up(n: int, equal: Callable[[int, int], bool]) -> bool:
    """Whether n answer items and n reference items pair up one-to-one (Kuhn's augmenting paths)."""
    owner: list[int | None] = [None] * n  # owner[reference item] = the answer item paired with it

    def place(item: int, seen: set[int]) -> bool:
        for ref in range(n):
            if ref not in seen and equal(item, ref):
                seen.add(ref)
                if owner[ref] is None or place(owner[ref], seen):
                    owner[ref] = item
                    return True
        return False

    return all(place(item, set()) for item in range(n))


def equivalent(answer: str, reference: str, options: RuleOptions, units: Any = None) -> Rule | None:
    """The rule by which `answer` is equivalent to `reference`, or None. `units`: a pint UnitRegistry."""
    if (rule := scalar_rule(answer, reference, options, units)) is not None:
        return rule
    list_rule = Rule.ORDERED_LIST if options.ordered_lists else Rule.UNORDERED_LIST
    if list_rule not in options.rules:
        return None
    items = [split_list(s, options.max_list_items) for s in (answer, reference)]
    if items[0] is None or items[1] is None or len(items[0]) != len(items[1]):
        return None
    a, r = items
    cache: dict[tuple[int, int], bool] = {}

    def equal(i: int, j: int) -> bool:
        if (i, j) not in cache:
            cache[i, j] = scalar_rule(a[i], r[j], options, units) is not None
        return cache[i, j]

    if options.ordered_lists:
        return list_rule if all(equal(i, i) for i in range(len(a))) else None
    return list_rule if pair_up(len(a), equal) else None
