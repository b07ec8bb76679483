"""mutmut with the project's extra mutation operators (scripts/mutation.sh runs it).

mutmut 3.8.1 already swaps the boundary of each comparison (``<`` / ``<=``, ``>`` / ``>=``, ``==``
/ ``!=``), replaces numbers, strings, assigned values and call arguments, and drops one argument
of a call. It has no operator for three kinds of bug an audit planted and the suite missed
(docs/testing.md, "Planted bugs"); this adds them to mutmut's table before its command runs:

- drop_call: a call made for its effect is dropped: ``self._on_switched(result)`` -> ``None``
  (the deployer moving pointers without telling the cameras), ``found.sort()`` -> ``None``;
- swap_arguments: two neighbouring positional arguments trade places: ``f(a, b)`` -> ``f(b, a)``
  (a unit, an order, a source and a target swapped);
- swap_min_max: ``min(...)`` <-> ``max(...)`` (a baseline capped the wrong way).

    .venv/bin/python scripts/mutation_operators.py run [mutmut's arguments]   # mutmut with them
    .venv/bin/python scripts/mutation_operators.py count FILE...              # mutants per operator

`count` needs no tests: it prints how many mutants each operator (mutmut's own and these) makes
in each FILE, e.g. to see what the extra operators add to a module.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import libcst as cst


def drop_call(node: cst.Expr) -> Iterable[cst.Expr]:
    """A call statement (its value unused, so it was made for its effect) becomes ``None``."""
    if isinstance(node.value, cst.Call):
        yield node.with_changes(value=cst.Name("None"))


def swap_arguments(node: cst.Call) -> Iterable[cst.Call]:
    """Each pair of neighbouring positional arguments that differ, swapped."""
    args = list(node.args)
    for i in range(len(args) - 1):
        first, second = args[i], args[i + 1]
        if first.keyword or second.keyword or first.star or second.star:
            continue
        if first.value.deep_equals(second.value):
            continue
        swapped = [first.with_changes(value=second.value), second.with_changes(value=first.value)]
        yield node.with_changes(args=[*args[:i], *swapped, *args[i + 2 :]])


def swap_min_max(node: cst.Call) -> Iterable[cst.Call]:
    """``min(...)`` -> ``max(...)`` and back."""
    if isinstance(node.func, cst.Name) and node.func.value in ("min", "max"):
        yield node.with_changes(func=cst.Name("max" if node.func.value == "min" else "min"))


EXTRA = [(cst.Expr, drop_call), (cst.Call, swap_arguments), (cst.Call, swap_min_max)]


def install() -> None:
    """Add the extra operators to mutmut's table (the list its mutation visitor reads; mutant
    generation forks from this process, so the workers see them too)."""
    from mutmut.mutation import mutators

    for entry in EXTRA:
        if entry not in mutators.mutation_operators:
            mutators.mutation_operators.append(entry)  # type: ignore[attr-defined]


def count(paths: list[str]) -> None:
    """Print the mutants each operator makes in each file of `paths`."""
    from mutmut.mutation import mutators
    from mutmut.mutation.file_mutation import MutationVisitor
    from mutmut.mutation.pragma_handling import get_ignored_lines

    for path in paths:
        code = Path(path).read_text()
        per_operator: Counter[str] = Counter()
        for node_type, operator in mutators.mutation_operators:
            wrapper = cst.MetadataWrapper(cst.parse_module(code))
            visitor = MutationVisitor([(node_type, operator)], get_ignored_lines(path, code, wrapper, None), None)
            wrapper.visit(visitor)
            inside = [m for m in visitor.mutations if m.contained_by_top_level_function is not None]
            per_operator[operator.__name__] += len(inside)
        extra = {operator.__name__ for _, operator in EXTRA}
        mutmut_own = sum(n for name, n in per_operator.items() if name not in extra)
        added = ", ".join(f"{name} {per_operator[name]}" for name in sorted(extra))
        print(f"{path}: {mutmut_own} mutants by mutmut's operators, and {added}")


def main() -> None:
    install()
    if sys.argv[1:2] == ["count"]:
        count(sys.argv[2:])
        return
    from mutmut.__main__ import cli

    sys.argv[0] = "mutmut"
    cli()


if __name__ == "__main__":
    main()
