"""Every promise in `docs/design/promises.md` names tests that exist: a fast check with no servers, the test files read
with `ast`, never collected.

The table's notation (its intro): `tests/f.py::test_x` a test function, or a method of a class, in that file;
`tests/f.py` a whole file; `::test_y` in the file of the reference before it; `..._asyncio` the reference before it
with its last `_word` replaced; `C::test_z` a test of the conformance suite (`fencelock/testing/conformance/`); a
parametrised id (`[asyncio]`) is stripped. A pattern with `*` or `test_x[...]` is a fault-matrix cell pattern
(after an `M`): `*-idle-*` matches some cell id of any matrix test, `test_zookeeper[*-idle-*]` one of that test; and
`matrix row `past_ttl`` a fault's row (`*-past_ttl-*`). The cell ids are computed as pytest would, from the
parametrize marks of `tests/matrix/test_matrix.py` (importing it starts no server). A pattern in parentheses right
after a whole file, `tests/f.py` (`*-cancel`), is that file's own cases: its words must be string constants there.
Any other backquoted text (`wait=0`) is prose."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMISES = ROOT / "docs" / "design" / "promises.md"
CONFORMANCE = ROOT / "src" / "fencelock" / "testing" / "conformance"
SPAN = re.compile(r"`([^`]+)`")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _tests_in(path: Path) -> set[str]:
    """The test functions of a file, also those defined in its classes."""
    return {node.name for node in ast.walk(_tree(path))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")}


def _strings_in(path: Path) -> set[str]:
    return {node.value for node in ast.walk(_tree(path))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


@cache
def _matrix_ids() -> tuple[str, ...]:
    """Every cell id of the fault matrix, `test_redis[sync-idle-acquire]`, from its parametrize marks."""
    from tests.matrix import test_matrix

    ids = []
    for name, function in vars(test_matrix).items():
        for mark in getattr(function, "pytestmark", []):
            if name.startswith("test_") and mark.name == "parametrize":
                labels = mark.kwargs["ids"]
                labels = labels if isinstance(labels, list) else [labels(value) for value in mark.args[1]]
                ids += [f"{name}[{label}]" for label in labels]
    return tuple(ids)


def _matches_a_cell(pattern: str) -> bool:
    regex = re.escape(pattern).replace(r"\*", ".*")
    if "[" not in pattern:
        regex = rf"\w+\[{regex}\]"
    return any(re.fullmatch(regex, cell) for cell in _matrix_ids())


def _rows() -> list[tuple[str, str]]:
    lines = PROMISES.read_text(encoding="utf-8").splitlines()
    start = lines.index("| promise | proved by |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = line.strip()[1:-1].split(" | ")
        assert len(cells) == 2, f"a row of promises.md is not two cells: {line}"
        rows.append((cells[0].strip(), cells[1].strip()))
    return rows


def _check_row(proof: str) -> tuple[int, list[str]]:
    """How many references a row's proof names, and what is wrong with them."""
    checked, broken = 0, []
    path: Path | None = None  # the file of the reference before
    name = ""  # the test name of the reference before
    end = 0
    for span in SPAN.finditer(proof):
        text, before, end = span.group(1), proof[end:span.start()], span.end()
        if text.startswith(("tests/", "::", "C::", "...")):
            checked += 1
            if text.startswith("tests/"):
                file, _, name = text.partition("::")
                path = ROOT / file
                if not path.is_file():
                    broken.append(f"`{text}`: no file {file}")
                    path, name = None, ""
                    continue
            elif text.startswith("C::"):
                name = text[3:]
            elif text.startswith("::"):
                name = text[2:]
            else:
                name = name.rpartition("_")[0] + text[3:] if name else ""
            name = name.partition("[")[0]
            if text.startswith("C::"):
                if not any(name in _tests_in(module) for module in CONFORMANCE.glob("*.py")):
                    broken.append(f"`{text}`: no such test in the conformance suite")
            elif path is None or (text.startswith(("::", "...")) and not name):
                broken.append(f"`{text}`: no file named before it")
            elif name and name not in _tests_in(path):
                broken.append(f"`{text}`: no test {name} in {path.relative_to(ROOT)}")
        elif "*" in text or re.fullmatch(r"test_\w+\[.+\]", text) or before.endswith("matrix row "):
            checked += 1
            if before.endswith("(") and path is not None and not name:
                words = {word for word in re.split(r"[-*\[\]]+", text) if word}
                if not words <= _strings_in(path):
                    broken.append(f"`{text}`: no such cases in {path.relative_to(ROOT)}")
            elif not _matches_a_cell(text if "*" in text or "[" in text else f"*-{text}-*"):
                broken.append(f"`{text}`: matches no cell of the fault matrix")
    return checked, broken


def test_every_promise_names_tests_that_exist() -> None:
    problems = []
    total = 0
    for promise, proof in _rows():
        checked, broken = _check_row(proof)
        total += checked
        if not checked:
            broken.append("no test named")
        problems += [f"{promise[:70]!r}: {problem}" for problem in broken]
    assert total > 0, "no references found in promises.md: has its table's notation changed?"
    assert not problems, f"{len(problems)} broken references in {PROMISES.relative_to(ROOT)}:\n  " + "\n  ".join(
        problems)
