"""The CEL side of the ``dra`` source: a device as Kubernetes hands it to the selectors of a
DeviceClass, and the part of Kubernetes' CEL library those selectors use.

Kubernetes judges selectors with cel-go and its own libraries; this controller judges them
again, to count what a node can give a class, with the Rust CEL implementation (the
``cel`` package of ``common-expression-language``), which knows the CEL standard
definitions only. What a selector may use beyond them is supplied here:

- quantities (capacity values, ``quantity()``): ``compareTo``, ``isGreaterThan``,
  ``isLessThan``, ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add``,
  ``sub``, and ``==`` by value (``quantity("1Gi") == quantity("1024Mi")``);
- semantic versions (``version`` attributes, ``semver()``): ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch``, and ``==`` by
  precedence (build metadata ignored).

A quantity travels through CEL as a one-key map ``{"@quantity": "<exact fraction>"}`` and a
version as ``{"@semver": "<major.minor.patch[-pre]>"}``: the library passes only plain
values, and a canonical text makes CEL's own ``==`` compare them by value. ``@`` cannot
start an attribute name, so neither map is mistaken for a device's attributes. A selector
naming any other function (``cel.bind``, ``lowerAscii``, ``url``...) is refused when it is
compiled, with its name: the library would fail it at every device, which would only read
as "no device matches".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

# The library is imported where selectors are compiled and judged, not here: the cluster
# view imports this module, and the layout checks that ship in the collection import the
# view on hosts that have the standard library only.
if TYPE_CHECKING:
    import cel

QUANTITY_KEY = "@quantity"
SEMVER_KEY = "@semver"

_NUMBER = r"([+-]?)(\d+(?:\.\d*)?|\.\d+)"
_QUANTITY = re.compile(_NUMBER + r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_INT64 = (-(2**63), 2**63 - 1)

_IDENT = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)

# Where Kubernetes looks up an attribute domain the device lacks, it gets an empty map
# (its `mapper`); the library raises instead. So the device variable gets an empty map for
# every domain a selector looks up by a literal (``attributes["x.example.com"]``) that the
# device lacks; a lookup by a computed key still raises, and so does not match. (A selector
# that both looks a domain up and asks ``"x" in device.attributes`` sees it there too.)
_LOOKUP = re.compile(r"""\b(?:attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]""")

# The standard functions the library evaluates as cel-go does (each tried on 0.10.0);
# operators (``_==_``, ``@in``, ``!_``...) and macros need no name here.
STANDARD_FUNCTIONS = frozenset(
    {"size", "startsWith", "endsWith", "contains", "matches", "int", "uint", "double"}
    | {"string", "bytes", "type", "dyn", "duration", "timestamp"}
)


# --- quantities and versions as CEL values ------------------------------------------------


def parse_quantity(text: str) -> Fraction | None:
    """A Kubernetes quantity ("80Gi", "500m", "1e3"), exactly; None if it is not one."""
    found = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None:
        return None
    sign, number, suffix = found.groups()
    value = Fraction(number) * (-1 if sign == "-" else 1)
    suffix = suffix or ""
    if suffix in _BINARY:
        return value * Fraction(1024) ** _BINARY[suffix]
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    return value * Fraction(10) ** exponent


def quantity_value(amount: Fraction) -> dict[str, str]:
    return {QUANTITY_KEY: str(amount)}


def _amount(value: Any) -> Fraction:
    if isinstance(value, dict) and set(value) == {QUANTITY_KEY}:
        return Fraction(value[QUANTITY_KEY])
    raise TypeError(f"not a quantity: {value!r}")


def _semver_parts(text: str, normalize: bool = False) -> tuple[int, int, int, str] | None:
    if not isinstance(text, str):
        return None
    if normalize:
        text = _normalized_semver(text)
    found = _SEMVER.fullmatch(text)
    if found is None:
        return None
    major, minor, patch, pre, _build = found.groups()
    return int(major), int(minor), int(patch), pre or ""


def _normalized_semver(text: str) -> str:
    """Kubernetes' ``semver(text, true)``: a leading "v" dropped, a missing minor or patch
    read as 0, leading zeros of the three numbers dropped."""
    text = text.strip().removeprefix("v")
    core, tail = re.match(r"([^-+]*)(.*)", text).groups()  # type: ignore[union-attr]
    numbers = core.split(".")
    if not 1 <= len(numbers) <= 3 or not all(n.isdigit() for n in numbers):
        return text
    numbers = [str(int(n)) for n in numbers] + ["0"] * (3 - len(numbers))
    return ".".join(numbers) + tail


def semver_value(text: str) -> dict[str, str] | None:
    """A ``version`` attribute as the matcher carries it; None if it is no semantic version."""
    parts = _semver_parts(text)
    if parts is None:
        return None
    major, minor, patch, pre = parts
    return {SEMVER_KEY: f"{major}.{minor}.{patch}" + (f"-{pre}" if pre else "")}


def _version(value: Any) -> tuple[int, int, int, str]:
    if isinstance(value, dict) and set(value) == {SEMVER_KEY}:
        parts = _semver_parts(value[SEMVER_KEY])
        if parts is not None:
            return parts
    raise TypeError(f"not a semantic version: {value!r}")


def _pre_key(pre: str) -> tuple[int, tuple[tuple[int, int, str], ...]]:
    """Semantic-version precedence of a pre-release: none ranks above any; numeric
    identifiers rank below alphanumeric ones; a longer list ranks above its prefix."""
    if not pre:
        return (1, ())
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")))


def _compare(left: Any, right: Any) -> int:
    """-1, 0 or 1: two quantities by value, or two versions by precedence."""
    if isinstance(left, dict) and QUANTITY_KEY in left:
        amounts = (_amount(left), _amount(right))
        return (amounts[0] > amounts[1]) - (amounts[0] < amounts[1])
    versions = [_version(v) for v in (left, right)]
    a, b = ((m, n, p, _pre_key(pre)) for m, n, p, pre in versions)
    return (a > b) - (a < b)


def _as_integer(value: Any) -> int:
    amount = _amount(value)
    if amount.denominator != 1 or not _INT64[0] <= amount <= _INT64[1]:
        raise ValueError(f"quantity {amount} is not an int64")
    return int(amount)


def _plus(left: Any, right: Any, sign: int) -> dict[str, str]:
    other = Fraction(right) if isinstance(right, int) else _amount(right)
    return quantity_value(_amount(left) + sign * other)


def _new_quantity(text: str) -> dict[str, str]:
    amount = parse_quantity(text)
    if amount is None:
        raise ValueError(f"invalid quantity {text!r}")
    return quantity_value(amount)


def _new_semver(text: str, normalize: bool = False) -> dict[str, str]:
    parts = _semver_parts(text, normalize)
    if parts is None:
        raise ValueError(f"invalid semantic version {text!r}")
    major, minor, patch, pre = parts
    return {SEMVER_KEY: f"{major}.{minor}.{patch}" + (f"-{pre}" if pre else "")}


# Member functions arrive with their receiver first (``q.compareTo(r)`` is ``compareTo(q,
# r)``). A function that raises makes the library print a line on stderr besides failing
# the evaluation; that only happens for a selector Kubernetes would fail too.
KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _new_quantity,
    "isQuantity": lambda text: parse_quantity(text) is not None,
    "semver": _new_semver,
    "isSemver": lambda text, normalize=False: _semver_parts(text, normalize) is not None,
    "compareTo": _compare,
    "isGreaterThan": lambda left, right: _compare(left, right) > 0,
    "isLessThan": lambda left, right: _compare(left, right) < 0,
    "sign": lambda value: (_amount(value) > 0) - (_amount(value) < 0),
    "isInteger": lambda value: _amount(value).denominator == 1,
    "asInteger": _as_integer,
    "asApproximateFloat": lambda value: float(_amount(value)),
    "add": lambda left, right: _plus(left, right, 1),
    "sub": lambda left, right: _plus(left, right, -1),
    "major": lambda value: _version(value)[0],
    "minor": lambda value: _version(value)[1],
    "patch": lambda value: _version(value)[2],
}


# --- the device variable ----------------------------------------------------------------


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    """An attribute or capacity name's domain and identifier: ``domain/id``, or a bare
    ``id`` of the driver's own domain (as Kubernetes' ``parseQualifiedName``)."""
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def attribute_value(value: Any) -> Any:
    """A ResourceSlice attribute (``{"string"|"int"|"bool"|"version": ...}``) as CEL sees
    it; ValueError for a value of no known kind, which Kubernetes refuses too."""
    if isinstance(value, Mapping):
        for kind in ("int", "bool", "string"):
            if kind in value:
                return value[kind]
        if "version" in value:
            version = semver_value(str(value["version"]))
            if version is not None:
                return version
            raise ValueError(f"version {value['version']!r} is not a semantic version")
    raise ValueError(f"attribute value {value!r} has no known kind")


def capacity_value(value: Any) -> dict[str, str]:
    """A ResourceSlice capacity (``{"value": "80Gi"}`` in v1; a bare quantity before)."""
    text = value.get("value") if isinstance(value, Mapping) else value
    amount = parse_quantity(str(text)) if text is not None else None
    if amount is None:
        raise ValueError(f"capacity {value!r} is not a quantity")
    return quantity_value(amount)


def device_variable(
    driver: str,
    attributes: Mapping[str, Any],
    capacity: Mapping[str, Any],
    domains: Iterable[str] = (),
    allow_multiple: bool = False,
) -> dict[str, Any]:
    """The ``device`` variable of a selector: ``driver``, and ``attributes`` and ``capacity``
    grouped by domain, with an empty map for each of ``domains`` the device lacks.
    ValueError for an attribute or capacity Kubernetes could not read either."""
    grouped_attributes: dict[str, dict[str, Any]] = {domain: {} for domain in domains}
    grouped_capacity: dict[str, dict[str, Any]] = {domain: {} for domain in domains}
    for name, value in attributes.items():
        domain, ident = split_qualified(str(name), driver)
        grouped_attributes.setdefault(domain, {})[ident] = attribute_value(value)
    for name, value in capacity.items():
        domain, ident = split_qualified(str(name), driver)
        grouped_capacity.setdefault(domain, {})[ident] = capacity_value(value)
    return {
        "driver": driver,
        "attributes": grouped_attributes,
        "capacity": grouped_capacity,
        "allowMultipleAllocations": allow_multiple,
    }


# --- selectors --------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """One compiled selector, and the domains its literals may look up."""

    expression: str
    program: cel.Program
    domains: frozenset[str]

    def evaluate(self, device: Mapping[str, Any]) -> bool | str:
        """True or False, or the text of why the selector could not judge the device (an
        evaluation error, or a result that is not a bool)."""
        import cel  # where used: see the import block

        context = cel.Context(variables={"device": dict(device)}, functions=KUBERNETES_FUNCTIONS)
        try:
            result = self.program.execute(context)
        # The library raises KeyError, RuntimeError, TypeError, ZeroDivisionError... for
        # what cel-go reports as one evaluation error: any of them is "cannot judge".
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        if not isinstance(result, bool):
            return f"evaluates to {type(result).__name__} {result!r}, not a bool"
        return result


def compile_selector(expression: str) -> Selector | str:
    """The compiled selector, or the text of why it cannot be one."""
    import cel  # where used: see the import block

    if not expression.strip():
        return "is empty"
    try:
        program = cel.compile(expression)
    # The library raises ValueError for a syntax error; anything else it raises is no
    # less a selector that cannot be compiled.
    except Exception as error:
        return f"does not compile: {error}"
    unknown = sorted(
        name
        for name in program.functions()
        if not name.startswith(("_", "@", "!", "-"))
        and name not in STANDARD_FUNCTIONS
        and name not in KUBERNETES_FUNCTIONS
    )
    if unknown:
        return (
            f"uses {', '.join(unknown)}, which this controller's CEL evaluator does not "
            "provide (it has CEL's standard functions, quantities and semantic versions)"
        )
    domains = frozenset(text for pair in _LOOKUP.findall(expression) for text in pair if text)
    return Selector(expression, program, domains)
