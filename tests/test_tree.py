"""The source tree keeps the shape docs/architecture.md describes.

No file in src/ or csrc/ is over 600 lines, and no folder of the package
holds more than a dozen modules; the package's imports run one way, from
the public modules through the op families (kernel/, callable/,
custom_kernel/) to the compilers (compilers/), then the trace-time pieces
every op shares (trace/) and the runtime (runtime/), never back, and no
family imports another; and the map in docs/architecture.md lists exactly
the modules the tree has. Read from the files: nothing is imported.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "numbax"
MAX_LINES = 600
MAX_MODULES_PER_FOLDER = 12

# What each part of the package may import, besides itself. "leaf" is the
# extension and the generated version files, which import nothing of
# numbax; "api" is the package's face (numbax/__init__.py, cli.py,
# export.py, diagnostics.py); bench/ is a tool built on all of it.
FAMILIES = ("kernel", "callable", "custom_kernel", "cpu_kernel")
SHARED = ("compilers", "trace", "runtime", "leaf")
MAY_IMPORT = {
    "leaf": set(),
    "runtime": {"leaf"},
    "trace": {"runtime", "leaf"},
    "compilers": {"trace", "runtime", "leaf"},
    **{family: set(SHARED) for family in FAMILIES},
    "api": set(FAMILIES) | set(SHARED) | {"bench"},
    "bench": set(FAMILIES) | set(SHARED) | {"api"},
}
LEAVES = {"numbax._core", "numbax._version", "numbax._build_info"}


def _modules() -> dict[str, Path]:
    """numbax.<dotted name> -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for path in PACKAGE.glob("_core*.so"):
        found["numbax._core"] = path
    found.setdefault("numbax._core", PACKAGE / "_core.pyi")
    found.setdefault("numbax._build_info", PACKAGE / "_build_info.py")
    return found


MODULES = _modules()


def _part(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and
                          (PACKAGE / parts[1]).is_dir()):
        return parts[1]
    return "api"


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks (annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
                node.test):
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def _imports(module: str, path: Path, *, top_level_only: bool = False):
    """(imported numbax module, line) for each import `module` makes at
    run time (not under TYPE_CHECKING)."""
    if module in LEAVES:
        # Import nothing of numbax; _build_info.py is written by the build,
        # so a fresh checkout has none.
        return
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in nodes:
        if getattr(node, "lineno", 0) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "numbax":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module
                                          else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "numbax":
                continue
            for alias in node.names:
                child = f"{source}.{alias.name}"
                yield (child if child in MODULES else source), node.lineno


def test_no_file_in_src_is_over_600_lines():
    over = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not over, (f"split these along a seam of their own (at most "
                      f"{MAX_LINES} lines, docs/architecture.md): {over}")


def test_no_file_in_csrc_is_over_600_lines():
    over = {str(p.relative_to(ROOT)): n
            for p in sorted((ROOT / "csrc").iterdir()) if p.is_file()
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not over, (
        f"C++ files over {MAX_LINES} lines, which docs/architecture.md "
        f"promises none is: split each along a seam of its own (one file "
        f"per concept, as the rest of csrc/): {over}")


def test_no_folder_holds_more_than_a_dozen_modules():
    # bench/ is the benchmark suite, a tool with a layout of its own.
    folders: dict[Path, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py" and "bench" not in path.relative_to(
                PACKAGE).parts:
            folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items()
               if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"group these into subpackages: {crowded}"


def test_imports_run_one_way_and_families_never_import_each_other():
    wrong = []
    for module, path in MODULES.items():
        if path.suffix != ".py":
            continue
        part = _part(module)
        for imported, line in _imports(module, path):
            target = _part(imported)
            if target != part and target not in MAY_IMPORT[part]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {part}/ "
                             f"imports {imported} ({target}/)")
    assert not wrong, ("imports against the layers of docs/architecture.md "
                       "(a family may reach another only through the "
                       "runtime's ops.Op):\n" + "\n".join(wrong))


def test_module_imports_have_no_circle():
    graph = {m: {i for i, _ in _imports(m, p, top_level_only=True)
                 if i != m and i in MODULES}
             for m, p in MODULES.items() if p.suffix == ".py"}
    # A package's __init__ imports its modules: the edge a module has to
    # its own package is its parent's import, not a circle.
    for m in graph:
        graph[m] = {i for i in graph[m] if not m.startswith(i + ".")}
    done: set[str] = set()
    stack: list[str] = []

    def visit(m):
        if m in stack:
            raise AssertionError(
                "modules importing each other at import time: "
                + " -> ".join(stack[stack.index(m):] + [m]))
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            visit(n)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def _find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (its nodes in order, the first repeated at the
    end), or None."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(node):
        if node in stack:
            return stack[stack.index(node):] + [node]
        if node in done:
            return None
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if (circle := visit(child)) is not None:
                return circle
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if (circle := visit(node)) is not None:
            return circle
    return None


def _every_import(module: str, path: Path) -> set[str]:
    """The numbax modules `module` names in any import: at the top, inside
    a function, or under TYPE_CHECKING."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names
                      if a.name.split(".")[0] == "numbax"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) -
                                          node.level + 1]
                source = ".".join(base + ([node.module] if node.module
                                          else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "numbax":
                continue
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in MODULES else source)
    # A package's __init__ imports its modules: the edge a module has to
    # its own package is its parent's import, not a circle.
    return {m for m in found if m in MODULES and m != module
            and not module.startswith(m + ".")}


def test_no_import_circle_anywhere_not_even_lazy_or_type_only():
    # An import inside a function or under TYPE_CHECKING still ties two
    # modules together: neither can be read, typed or moved without the
    # other. A module that needs something of one that imports it gets it
    # passed in (as compilers/numba_cuda_mlir_launch.py gets its Needs).
    graph = {m: _every_import(m, p) for m, p in MODULES.items()
             if p.suffix == ".py" and m not in LEAVES}
    circle = _find_circle(graph)
    assert circle is None, (
        "modules importing each other (lazy and type-only imports "
        "included): " + " -> ".join(circle or ()) + "; hand the one below "
        "what it needs, or let it say so in a Protocol")


def _family_modules(family: str) -> dict[str, Path]:
    return {m: p for m, p in MODULES.items()
            if m.startswith(f"numbax.{family}.") and p.suffix == ".py"}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_has_no_import_circle_not_even_type_only(family):
    # Type-only imports count: a circle under TYPE_CHECKING is still a
    # family whose modules cannot be read (or typed) one without the other.
    modules = _family_modules(family)
    graph = {}
    for m, p in modules.items():
        graph[m] = set()
        package = m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = ([f"{package}.{node.module}"] if node.module else
                         [f"{package}.{a.name}" for a in node.names])
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}"
                                         for a in node.names]
            else:
                continue
            graph[m] |= {n for n in names if n in modules and n != m}
    done: set[str] = set()
    stack: list[str] = []

    def visit(m):
        if m in stack:
            raise AssertionError(
                f"{family}/ has an import circle (type-only imports "
                "included): " + " -> ".join(stack[stack.index(m):] + [m])
                + "; let the module that needs the op say so in a Protocol")
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


# Every family keeps to its op's public members: a new family is checked
# as soon as FAMILIES names it.
OWNING_FAMILIES = FAMILIES


@pytest.mark.parametrize("family", OWNING_FAMILIES)
def test_no_private_member_of_an_op_is_read_outside_its_module(family):
    # The op's private members are those its op.py uses on self and the
    # private methods its classes define; the family's other modules own
    # their state, and use the op's public members.
    op_path = PACKAGE / family / "op.py"
    op_tree = ast.parse(op_path.read_text())
    private = {node.attr for node in ast.walk(op_tree)
               if isinstance(node, ast.Attribute)
               and isinstance(node.value, ast.Name)
               and node.value.id == "self" and node.attr.startswith("_")
               and not node.attr.startswith("__")}
    private |= {node.name for cls in ast.walk(op_tree)
                if isinstance(cls, ast.ClassDef) for node in cls.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name.startswith("_")
                and not node.name.startswith("__")}
    found = []
    for m, p in _family_modules(family).items():
        if p == op_path:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private \
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls")):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}: "
                             f"{ast.unparse(node)}")
    assert not found, (
        "modules reaching into their op's private members (give the state "
        "to the module that uses it, or make what it needs public):\n"
        + "\n".join(found))


# csrc/'s ends, as docs/architecture.md names them: the bindings and the
# capture handler on top (no file includes them), the pieces every handler
# builds on at the bottom (they include no file of csrc/).
CSRC = ROOT / "csrc"
CSRC_TOP = ("module", "capture_handler")
CSRC_BOTTOM = ("call_frame", "interpreter", "call_guard", "python_hooks",
               "ffi_binding", "status_codes")


def _csrc_units() -> dict[str, set[str]]:
    """csrc/'s include graph by unit (a .cc and its .h are one unit, named
    by their stem): unit -> the other units its files include."""
    units: dict[str, set[str]] = {}
    for path in sorted(CSRC.iterdir()):
        if path.suffix not in (".cc", ".h"):
            continue
        own = units.setdefault(path.stem, set())
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"',
                               path.read_text(), re.M):
            if (CSRC / name).is_file() and Path(name).stem != path.stem:
                own.add(Path(name).stem)
    return units


def test_csrc_includes_run_one_way():
    # "No include back up": the units of csrc/ form a graph without a
    # circle (so each can be read, and tested, with only those below it),
    # whose ends are the ones docs/architecture.md names.
    units = _csrc_units()
    circle = _find_circle(units)
    assert circle is None, (
        "csrc/ files including each other (a .cc and its .h as one unit): "
        + " -> ".join(circle or ()) + "; move what both need into a header "
        "of its own below them, or declare a file's functions in its own "
        "header")
    included = {u for targets in units.values() for u in targets}
    assert not included & set(CSRC_TOP), (
        f"{sorted(included & set(CSRC_TOP))} are csrc/'s top: nothing "
        "includes them (docs/architecture.md)")
    reaching = {u: sorted(units[u]) for u in CSRC_BOTTOM if units.get(u)}
    assert not reaching, (
        f"csrc/'s bottom includes files of csrc/: {reaching} "
        "(docs/architecture.md: they include none)")
    assert set(CSRC_TOP) | set(CSRC_BOTTOM) <= set(units), (
        "docs/architecture.md's ends of csrc/ name units that do not exist: "
        f"{sorted(set(CSRC_TOP) | set(CSRC_BOTTOM) - set(units))}")


# Files of other projects that comments name (their headers, their
# modules), which this repository does not hold.
FOREIGN_FILES = {
    "cuda.h", "vector_types.h", "vector_functions.h", "device_types.h",
    "nvtxImpl.h", "nvtx3/nvtxDetail/nvtxTypes.h",  # CUDA and NVTX headers
    "descriptor.py",  # numba-cuda-mlir's dispatcher module
}
_FILE_NAME = re.compile(r"(?<![\w/.])((?:\w+/)*\w+\.(?:py|pyi|cc|h))(?!\.?\w)")


def _commentary(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each docstring and comment of a source file."""
    text = path.read_text()
    if path.suffix != ".py":
        return [(n, line.split("//", 1)[1])
                for n, line in enumerate(text.splitlines(), 1)
                if "//" in line]
    found = [(n.lineno if not isinstance(n, ast.Module) else 1, doc)
             for n in ast.walk(ast.parse(text))
             if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                               ast.AsyncFunctionDef))
             and (doc := ast.get_docstring(n, clean=False))]
    found += [(t.start[0], t.string) for t in tokenize.generate_tokens(
        io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return found


def test_no_docstring_or_comment_names_a_file_that_does_not_exist():
    # A file named as "the one that does this" must be there to read; a
    # rename or a merge that left its old name behind sends the reader
    # nowhere. A name is found if some file of the repository ends with it.
    tracked = [p.relative_to(ROOT).as_posix() for top in
               ("src", "csrc", "tests", "scripts", "docs", "cmake",
                "benchmarks", "examples") if (ROOT / top).is_dir()
               for p in (ROOT / top).rglob("*") if p.is_file()]

    def exists(name):
        return any(t == name or t.endswith("/" + name) for t in tracked)

    missing = []
    sources = sorted(PACKAGE.rglob("*.py")) + sorted(
        p for p in CSRC.iterdir() if p.suffix in (".cc", ".h"))
    for path in sources:
        for line, text in _commentary(path):
            missing += [f"{path.relative_to(ROOT)}:{line}: {name}"
                        for name in _FILE_NAME.findall(text)
                        if name not in FOREIGN_FILES and not exists(name)]
    assert not missing, (
        "docstrings and comments naming files that do not exist (name the "
        "file that now does it):\n" + "\n".join(missing))


def _documented_map() -> dict[str, set[str]]:
    """docs/architecture.md's map: folder -> the modules its row lists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([\w/]+/)`\s*\|.*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([\w.]+\.(?:py|pyi))`",
                                              m.group(2)))
    return rows


def test_the_architecture_map_lists_every_module():
    documented = _documented_map()
    actual: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE.parent).as_posix() + "/"
        if folder.startswith("numbax/bench/") or path.name in (
                "__init__.py", "_build_info.py"):
            continue  # bench/ is one row; __init__.py holds no code of note
        actual.setdefault(folder, set()).add(path.name)
    actual["numbax/bench/"] = set()
    assert set(documented) == set(actual), (
        "docs/architecture.md's map has rows for folders "
        f"{sorted(documented)}, the tree {sorted(actual)}")
    for folder, names in actual.items():
        assert documented[folder] >= names, (
            f"docs/architecture.md's map does not list {folder}"
            f"{sorted(names - documented[folder])}")
        assert documented[folder] <= names | {"_core.pyi"}, (
            f"docs/architecture.md's map lists {folder}"
            f"{sorted(documented[folder] - names)}, which do not exist")


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_every_part_of_the_layers_exists(part):
    assert any(_part(m) == part for m in MODULES), part


def test_the_build_asks_for_the_python_the_package_requires():
    # CMake's find_package(Python X.Y) is a floor: it must be the one
    # pyproject.toml's requires-python promises, or a build on an older
    # interpreter starts and fails later, far from the reason.
    floor = re.search(r'requires-python\s*=\s*">=\s*(\d+\.\d+)"',
                      (ROOT / "pyproject.toml").read_text())
    asked = re.search(r"find_package\(Python\s+(\d+\.\d+)",
                      (ROOT / "CMakeLists.txt").read_text())
    assert floor and asked and asked.group(1) == floor.group(1), (
        f"CMakeLists.txt asks for Python {asked and asked.group(1)}, "
        f"pyproject.toml requires {floor and floor.group(1)}: make them one")


def _ci_chain() -> list[Path]:
    """.ci/run and every script it runs: the ``scripts/....sh`` or ``.py``
    named outside comments in the shell scripts (the Python ones run none)."""
    seen, todo = [], [ROOT / ".ci" / "run"]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        if path.suffix == ".py":
            continue
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            todo += [ROOT / m for m in re.findall(r"scripts/[\w/]+\.(?:sh|py)", code)]
    return seen


def test_the_ci_chain_stays_small_and_schedules_nothing_itself():
    """The CI is a declared list of rows run in a loop, tests spread by
    pytest-xdist: under 800 lines, no job scheduler of its own (background
    jobs waited on by dependency) and no recorded test times."""
    chain = _ci_chain()
    names = {p.relative_to(ROOT).as_posix() for p in chain}
    assert {".ci/run", "scripts/test.sh", "scripts/wheel_matrix.sh"} <= names, names
    lines = sum(len(p.read_text().splitlines()) for p in chain)
    assert lines < 800, f"the CI chain is {lines} lines: {sorted(names)}"
    for p in chain:
        text = p.read_text()
        assert "test_times" not in text and "wait -n" not in text, p
    assert not (ROOT / "tests" / "test_times.json").exists()


def test_sanitizer_parts_cover_every_gpu_file_once():
    """scripts/sanitizer_check.sh runs memcheck in parts: together they run
    every file holding `gpu` tests, each in one part only."""
    import subprocess
    gpu_files = sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")
        if re.search(r"^[^#]*\bpytest\.mark\.gpu\b", p.read_text(), re.M))
    assert gpu_files
    for n in (1, 4, 6):
        out = subprocess.run(["bash", "scripts/sanitizer_check.sh", "list", str(n)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        parts = [line.split(":", 1)[1].split() for line in out.stdout.splitlines()
                 if line.startswith("part ")]
        assert len(parts) == n, out.stdout
        listed = [f for part in parts for f in part]
        assert sorted(listed) == gpu_files, (n, out.stdout)
