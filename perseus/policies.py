"""Plan policies: the one table of the ways a frontier point is chosen.

Each :class:`Policy` has a name (which is also the name of its main parameter: the REST query
parameter ``?deadline=1.2``, the request field ``{"deadline": 1.2}``, the CLI option
``--deadline 1.2``), its parameters with their units and bounds, what it selects, and a resolver
from a :class:`~perseus.frontier.Frontier` to a point's index. The server's query parameters,
request and response models, the ``perseus frontier`` options, OpenAPI and the docs' table are
built from :data:`POLICIES` or tested against it, so adding a policy means adding its entry here,
its resolver and its tests.

Besides its main parameter a policy may take *options*: ``eta``'s ``max_power`` (a request may
give it; the server otherwise takes it from the job's ranks or GPU model) and ``power_budget``'s
``copies`` (the job's ``data_parallel x tensor_parallel`` copies of a pipeline, which the server
supplies and no request gives: ``public=False``).

Pure Python (no server imports; numpy only once a resolver runs), so the CLI builds its options
from it on a plain rank-client install too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perseus.errors import InfeasibleError, OptionError

if TYPE_CHECKING:
    from perseus.frontier import Frontier

__all__ = [
    "Parameter",
    "Policy",
    "POLICIES",
    "POLICY_NAMES",
    "CRITERIA_FIRST",
    "chosen",
    "resolve",
    "describe",
    "markdown_table",
]


@dataclass(frozen=True)
class Parameter:
    """One number a policy takes.

    Attributes:
        name: its name in queries, request bodies and (dashes for underscores) CLI options.
        unit: ``"s"``, ``"J"``, ``"W"``, or ``""`` for a pure number or an index.
        description: one line for OpenAPI, the CLI's help and the docs.
        minimum / maximum: bounds (``None``: unbounded); ``exclusive_minimum``: ``> minimum``.
        integer: an integer (a frontier index).
        public: a request may give it (``False``: the server supplies it from the job).
    """

    name: str
    unit: str
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    integer: bool = False
    public: bool = True

    def check(self, value: float) -> float:
        """``value`` as a float within the bounds; :class:`OptionError` naming the parameter."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f"{self.name} must be a number, got {value!r}", field=self.name)
        v = float(value)
        if not math.isfinite(v):
            raise OptionError(
                f"{self.name} must be a finite number, got {value!r}", field=self.name
            )
        if self.integer and v != int(v):
            raise OptionError(f"{self.name} must be an integer, got {value!r}", field=self.name)
        lo, hi = self.minimum, self.maximum
        if lo is not None and (v <= lo if self.exclusive_minimum else v < lo):
            raise OptionError(
                f"{self.name} must be {self.bounds()}, got {value!r}", field=self.name
            )
        if hi is not None and v > hi:
            raise OptionError(
                f"{self.name} must be {self.bounds()}, got {value!r}", field=self.name
            )
        return v

    def bounds(self) -> str:
        """The bounds in words: ``> 0``, ``in [0, 1]``, ``>= 0``."""
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            return f"in {'(' if self.exclusive_minimum else '['}{_num(lo)}, {_num(hi)}]"
        if lo is not None:
            return f"{'>' if self.exclusive_minimum else '>='} {_num(lo)}"
        return f"<= {_num(hi)}" if hi is not None else "any number"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


#: ``resolver(frontier, value, options) -> index``; raises InfeasibleError / OptionError.
Resolver = Callable[["Frontier", float, Mapping[str, float]], int]


@dataclass(frozen=True)
class Policy:
    """One way of choosing a frontier point.

    Attributes:
        parameter: the main parameter; its name is the policy's name.
        selects: what the policy selects, in words (the docs' table, OpenAPI).
        resolver: the frontier query.
        options: further parameters (see the module docstring).
        zeus: the optimum selector of Zeus's power-limit optimizer that this policy stands for
            (``ZeusCost``, ``MaxSlowdownConstraint``, ``Energy``, ``Time``), if any.
    """

    parameter: Parameter
    selects: str
    resolver: Resolver
    options: tuple[Parameter, ...] = ()
    zeus: str = ""

    @property
    def name(self) -> str:
        """The policy's name: its main parameter's."""
        return self.parameter.name

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        """The main parameter and the options."""
        return (self.parameter, *self.options)

    def describe(self, value: float, options: Mapping[str, float] | None = None) -> str:
        """The policy and its value in words (a deployment's reason)."""
        if self.name == "index":
            return "fastest plan (point 0)" if value == 0 else f"frontier point {int(value)}"
        unit = f" {self.parameter.unit}" if self.parameter.unit else ""
        text = f"{self.name.replace('_', ' ')} {value:g}{unit}"
        shown = [
            f"{p.name.replace('_', ' ')} {options[p.name]:g}{' ' + p.unit if p.unit else ''}"
            for p in self.options
            if p.public and options and p.name in options
        ]
        return text + (f" ({', '.join(shown)})" if shown else "")


def _index(frontier: Frontier, value: float, options: Mapping[str, float]) -> int:
    i = int(value)
    if not (0 <= i < len(frontier)):  # infeasible, not malformed: a re-solve may shrink it
        raise InfeasibleError(f"index must be between 0 and {len(frontier) - 1}, got {i}")
    return i


def _power_budget(frontier: Frontier, value: float, options: Mapping[str, float]) -> int:
    from perseus.power.plan_power import index_for_power_budget

    # raises PowerBudgetError (an InfeasibleError) naming the lowest achievable power
    return index_for_power_budget(frontier, value, pipelines=int(options.get("copies", 1)))


def _cost(frontier: Frontier, value: float, options: Mapping[str, float]) -> int:
    max_power = options.get("max_power")
    if max_power is None:
        raise OptionError(
            "the cost policy needs the GPUs' maximum power limit and this job has none: give "
            "max_power (W per GPU), register ranks that report it, or name a known gpu_model",
            field="max_power",
        )
    return frontier.index_for_cost(value, max_power)


_MAX_POWER = Parameter(
    "max_power",
    "W",
    "One GPU's maximum power limit (MAXPOWER = max_power x the pipeline's ranks); default: "
    "what the job's ranks registered, else the job's known gpu_model.",
    minimum=0,
    maximum=10_000,
    exclusive_minimum=True,
)
_COPIES = Parameter(
    "copies",
    "",
    "The job's data_parallel x tensor_parallel copies of one pipeline.",
    minimum=1,
    integer=True,
    public=False,
)

#: Every plan policy, by name, in the order the API and the docs list them.
POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            Parameter(
                "index",
                "",
                "A frontier point by index.",
                minimum=0,
                maximum=2**31 - 1,
                integer=True,
            ),
            "frontier point I",
            _index,
        ),
        Policy(
            Parameter(
                "deadline", "s", "Iteration time limit (s).", minimum=0, exclusive_minimum=True
            ),
            "the least-energy plan that finishes within S seconds",
            lambda f, v, o: f.index_for_deadline(v),
        ),
        Policy(
            Parameter("slowdown", "", "Allowed slowdown vs max clocks (0.05 = 5 %).", minimum=0),
            "the least-energy plan at most X slower than T0 (`0.05` = 5 %)",
            lambda f, v, o: f.index_for_slowdown(v),
            zeus="`MaxSlowdownConstraint(factor)`: `slowdown = factor − 1`; `Time`: `slowdown=0`",
        ),
        Policy(
            Parameter(
                "energy_budget",
                "J",
                "Energy per iteration limit (J).",
                minimum=0,
                exclusive_minimum=True,
            ),
            "the fastest plan using at most J joules per iteration",
            lambda f, v, o: f.index_for_energy_budget(v),
        ),
        Policy(
            Parameter(
                "power_budget",
                "W",
                "Average power limit (W, whole job): the fastest plan within it.",
                minimum=0,
                exclusive_minimum=True,
            ),
            "the fastest plan whose average power (whole job: pipelines × tensor-parallel "
            "degree × E/T) is at most W watts; ties: least energy",
            _power_budget,
            (_COPIES,),
        ),
        Policy(
            Parameter(
                "eta",
                "",
                "Zeus's cost: the plan minimising eta * E + (1 - eta) * MAXPOWER * T.",
                minimum=0,
                maximum=1,
            ),
            "Zeus's cost: the plan minimising `eta × E + (1 − eta) × MAXPOWER × T`, "
            "`MAXPOWER` = `max_power` (W per GPU) × ranks; 0: the fastest plan, 1: the "
            "least-energy plan",
            _cost,
            (_MAX_POWER,),
            zeus="`ZeusCost(eta_knob, world_size)`: `eta = eta_knob` (MAXPOWER per GPU × GPUs); "
            "`Energy`: `eta=1`; `Time`: `eta=0`",
        ),
    )
}

#: The policies' names (the REST query parameters, the request fields, the CLI options). The
#: explicit choice (``index``) comes first: given with a criterion, the criterion is at fault.
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
#: The names as a request lacking any is told them: the criteria first, then ``index``.
CRITERIA_FIRST: tuple[str, ...] = tuple(n for n in POLICY_NAMES if n != "index") + ("index",)


def chosen(given: Mapping[str, float | None]) -> tuple[str, float, dict[str, float]] | None:
    """The one policy among ``given``: ``(name, value, options)``, or ``None`` when none is given.

    ``given`` holds request fields, query parameters or CLI options; those that are ``None``
    were not given. Raises :class:`OptionError` naming the field for two policies, an option
    without its policy, or a value out of bounds.
    """
    names = [n for n in POLICY_NAMES if given.get(n) is not None]
    if len(names) > 1:
        raise OptionError(f"give at most one of {', '.join(POLICY_NAMES)}", field=names[1])
    opts = {
        p.name: p
        for pol in POLICIES.values()
        for p in pol.options
        if p.public and given.get(p.name) is not None
    }
    if not names:
        if opts:
            name = next(iter(opts))
            owner = next(pol.name for pol in POLICIES.values() if opts[name] in pol.options)
            raise OptionError(f"{name} is an option of {owner}: give {owner} too", field=name)
        return None
    policy = POLICIES[names[0]]
    for name in opts:
        if opts[name] not in policy.options:
            raise OptionError(f"{name} is not an option of {policy.name}", field=name)
    value = policy.parameter.check(given[policy.name])  # type: ignore[arg-type]
    return policy.name, value, {n: p.check(given[n]) for n, p in opts.items()}  # type: ignore[arg-type]


def resolve(
    frontier: Frontier, name: str, value: float, options: Mapping[str, float] | None = None
) -> int:
    """The frontier index policy ``name`` selects with ``value``.

    Raises :class:`~perseus.errors.InfeasibleError` when no plan meets it and
    :class:`~perseus.errors.OptionError` (naming the field) for a bad name or value.
    """
    policy = POLICIES.get(name)
    if policy is None:
        raise OptionError(
            f"unknown plan policy {name!r}; expected one of {', '.join(POLICY_NAMES)}", field=name
        )
    return policy.resolver(frontier, value, options or {})


def describe(name: str, value: float, options: Mapping[str, float] | None = None) -> str:
    """Policy ``name`` with ``value`` in words."""
    return POLICIES[name].describe(value, options)


def markdown_table() -> str:
    """The docs' policy table (docs/server.md holds it verbatim; a test keeps them equal)."""
    letter = {"s": "S", "J": "J", "W": "W"}
    rows = ["| query | selects | Zeus |", "|---|---|---|"]
    for p in POLICIES.values():
        arg = "I" if p.parameter.integer else letter.get(p.parameter.unit, "X")
        query = f"`{p.name}={arg}`" + "".join(f" [`&{o.name}=W`]" for o in p.options if o.public)
        rows.append(f"| {query} | {p.selects} | {p.zeus} |")
    return "\n".join(rows)
