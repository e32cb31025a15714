"""The project's structure as its docs promise it: the package holds no benchmark code and imports
none, its modules form no import cycle, and every repository path a document or comment names
exists. Read from the files themselves (ast and text), nothing is imported."""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "dra"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package `path` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # a module's own package is not a dependency
                found.add(t)
    return found


def test_the_package_holds_and_imports_no_benchmark_code() -> None:
    assert not (PACKAGE / "bench" / "_report.py").exists()
    suites = {p.stem for p in (ROOT / "benchmarks" / "dra_bench").glob("*.py") if not p.stem.startswith("_")}
    assert {"faults", "sim", "rl", "pool", "sage", "resize"} <= suites
    in_package = {p.stem for p in (PACKAGE / "bench").glob("*.py")}
    assert in_package == {"__init__", "__main__"}, f"python/dra/bench is only the entry that finds the suites: {in_package}"
    for name, path in _modules().items():
        if name == "dra.bench.__main__":  # the one entry that finds the suites and runs them
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+dra_bench\b", text, re.M), f"{name} imports benchmark code"


def test_no_import_cycles_in_the_package() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # Strongly connected components (Tarjan): a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # A package's __init__ re-exporting its submodules, which import the package's other parts, is
    # not a cycle between files; only cycles among leaf modules count.
    leaf_cycles = [[m for m in c if modules[m].name != "__init__.py"] for c in cycles]
    leaf_cycles = [c for c in leaf_cycles if len(c) > 1 and _really_cyclic(c, graph)]
    assert not leaf_cycles, f"import cycles: {leaf_cycles}"


def _really_cyclic(component: list[str], graph: dict[str, set[str]]) -> bool:
    """True when the modules of `component` reach each other without passing through a package."""
    members = set(component)
    for start in component:
        seen, todo = set(), [w for w in graph[start] if w in members]
        while todo:
            v = todo.pop()
            if v == start:
                return True
            if v not in seen:
                seen.add(v)
                todo.extend(w for w in graph[v] if w in members)
    return False


_ROOTS = "include|src|python|docs|benchmarks|tests|examples|data|scripts|cmake"
# A path of this repository: starts at one of its top folders, not inside another path, a URL or
# another repository's path (written `owner/repo:path`).
_PATH = re.compile(rf"(?<![\w./:-])((?:{_ROOTS})/[\w.+-]+(?:/[\w.+-]+)*(?:\.\{{[\w,]+\}})?/?)")
_TEXT = (".md", ".hpp", ".cpp", ".h", ".py", ".sh", ".cmake", ".toml", ".in")


def _tracked() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if f.endswith(_TEXT) or f.endswith("CMakeLists.txt")]


def _exists(path: str, beside: Path) -> bool:
    path = path.rstrip(".,:;)`'\"")
    brace = re.match(r"(.*)\.\{([\w,]+)\}$", path)
    variants = [f"{brace.group(1)}.{e}" for e in brace.group(2).split(",")] if brace else [path]
    for v in variants:
        for base in (ROOT, beside):
            if (base / v).exists() or any((base / v).parent.glob((base / v).name + ".*")):
                return True
    return False


def test_every_path_a_document_or_comment_names_exists() -> None:
    missing = []
    for f in _tracked():
        if f.startswith("docs/results/") and not f.endswith(".md"):
            continue  # raw outputs of dated runs
        text = (ROOT / f).read_text(errors="replace")
        for m in _PATH.finditer(text):
            ref = m.group(1)
            tail = text[m.end(): m.end() + 1]
            if tail and tail in "*<{$":  # a pattern (tests/cpp/test_<area>.cpp, test_elastic_*.py, seed$s)
                continue
            if not _exists(ref, (ROOT / f).parent):
                missing.append(f"{f}: {ref}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_no_citation_of_a_document_outside_the_repository() -> None:
    """The product brief and the notes on competitors the project was started from are not part of
    the repository: a comment or document cites the design note or guide here that explains the
    thing (docs/design/, docs/guide/)."""
    outside = ["DESIGN" + ".md", "ANCHORS" + ".md"]  # spelt in two parts so this file cites neither
    citing = [f"{f}: {name}" for f in _tracked() for name in outside if name in (ROOT / f).read_text(errors="replace")]
    assert not citing, ("files citing a document that is not in the repository; cite docs/design/<note>.md:\n"
                        + "\n".join(citing))
