"""The share of the package's lines that are docstrings (module, class and function), counted with ``ast``:
``python benchmarks/docstring_share.py [PATH ...]`` (default: src/fixedhead), one line per folder and the total,
plus the number of ``Raises:`` sections and of docstrings of 15 lines or more."""

import ast
import sys
from collections import Counter
from pathlib import Path


def count(path: Path) -> tuple[int, int, int, int]:
    """(lines, docstring lines, ``Raises:`` sections, docstrings of 15+ lines) of one file."""
    text = path.read_text()
    lines = len(text.splitlines())
    doc = raises = long = 0
    for node in ast.walk(ast.parse(text)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and (text := ast.get_docstring(node, clean=False)) is not None:
            n = node.body[0].end_lineno - node.body[0].lineno + 1
            doc, long = doc + n, long + (n >= 15)
            raises += "Raises:" in text
    return lines, doc, raises, long


def main(roots: list[str]) -> None:
    totals: Counter = Counter()
    by_folder: dict[str, Counter] = {}
    for root in map(Path, roots):
        for path in sorted(root.rglob("*.py")):
            lines, doc, raises, long = count(path)
            folder = str(path.parent.relative_to(root.parent))
            by_folder.setdefault(folder, Counter()).update(lines=lines, doc=doc, raises=raises, long=long)
            totals.update(lines=lines, doc=doc, raises=raises, long=long)
    for folder, c in sorted(by_folder.items()):
        print(f"{folder:40s} {c['lines']:6d} lines {c['doc']:5d} docstring ({c['doc'] / c['lines']:.0%})")
    print(
        f"{'total':40s} {totals['lines']:6d} lines {totals['doc']:5d} docstring "
        f"({totals['doc'] / totals['lines']:.1%}); {totals['raises']} Raises: sections; "
        f"{totals['long']} docstrings of 15+ lines"
    )


if __name__ == "__main__":
    main(sys.argv[1:] or ["src/fixedhead"])
