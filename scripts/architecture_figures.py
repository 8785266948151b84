"""The size and coupling figures of the package, computed from the source.

    python scripts/architecture_figures.py [--check]

Prints the largest module, the longest function (its docstring left out),
the private names of a public module used by another module, and the
number of modules over the size limits of STYLE.md. `--check` exits with
status 1 when a figure is over its limit (500 lines a module, 80 lines a
function, no private name of a public module used elsewhere).
"""

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keras_attention"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_public(name):
    return not any(part.startswith("_") for part in name.split(".")[1:])


def function_lengths(path, tree):
    """`(lines, qualified name)` of every function, docstring left out."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0]
        start = node.lineno
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            docstring = first.end_lineno - first.lineno + 1
        else:
            docstring = 0
        lines = node.end_lineno - start + 1 - docstring
        yield lines, f"{module_name(path)}.{node.name}"


def private_uses(trees):
    """`module.attribute` where another module reads a private name of a
    public module (`functional._attention`)."""
    modules_ = {module_name(p) for p, _ in trees}
    public = {name for name in modules_ if is_public(name)}
    found = set()
    for path, tree in trees:
        here = module_name(path)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in public:
                        aliases[alias.asname or alias.name] = full
                    elif (
                        node.module in public
                        and node.module != here
                        and alias.name.startswith("_")
                        and not alias.name.startswith("__")
                        and f"{node.module}.{alias.name}" not in modules_
                    ):
                        found.add(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in public:
                        aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != here
            ):
                found.add(f"{aliases[node.value.id]}.{node.attr}")
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    trees = list(modules())
    sizes = sorted(
        ((len(p.read_text().splitlines()), module_name(p)) for p, _ in trees),
        reverse=True,
    )
    functions = sorted(
        (f for p, t in trees for f in function_lengths(p, t)), reverse=True
    )
    private = private_uses(trees)
    big_modules = [s for s in sizes if s[0] > MAX_MODULE_LINES]
    long_functions = [f for f in functions if f[0] > MAX_FUNCTION_LINES]
    print(f"largest module: {sizes[0][1]} ({sizes[0][0]} lines)")
    print(f"longest function: {functions[0][1]} ({functions[0][0]} lines)")
    print(f"modules over {MAX_MODULE_LINES} lines: {len(big_modules)}")
    for lines, name in big_modules:
        print(f"  {name}: {lines}")
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(long_functions)}")
    for lines, name in long_functions:
        print(f"  {name}: {lines}")
    print(f"private names of public modules used elsewhere: {len(private)}")
    for name in private:
        print(f"  {name}")
    if args.check and (big_modules or long_functions or private):
        sys.exit(1)


if __name__ == "__main__":
    main()
