"""The package's layers, read from its imports (`ast`): no module imports a layer above its own,
and nothing in it imports streamlit.

Layers, low to high: core (errors, progress, defaults) < engine < inputs < methods < analyses <
presentation < front ends (cli, __main__, the package's __init__). A module may import its own
layer and the layers below; imports inside functions count too, and so does a function named
by a string ("attribution.inputs.data_files:_read_in_jail": how the jail's tasks name what their
child imports) for the layers, though not for import cycles.
"""
import ast
import re
from pathlib import Path

import pytest
from tests.support import ROOT

PACKAGE = ROOT / "attribution"
LAYERS = ("core", "engine", "inputs", "methods", "analyses", "presentation", "front")
CORE = {"attribution.errors", "attribution.progress", "attribution.defaults"}


def _module_name(path: Path) -> str:
    parts = ("attribution",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if module in CORE:
        return LAYERS.index("core")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS):  # inside a subpackage
        return LAYERS.index(parts[1])
    if len(parts) == 2 and parts[1] in ("engine", "methods", "inputs", "analyses", "presentation"):
        return LAYERS.index(parts[1])
    return LAYERS.index("front")


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The project modules a `from ... import ...` statement in `module` reads."""
    if node.level:
        package = module.split(".")
        if not MODULES[module].name == "__init__.py":
            package = package[:-1]
        base = package[:len(package) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("attribution"):
        return []
    found = []
    for alias in node.names:
        candidate = f"{target}.{alias.name}"
        found.append(candidate if candidate in MODULES else target)
    return found


NAMED_FUNCTION = re.compile(r"(attribution(?:\.\w+)+):\w+")
"""A function named by a string, "package.module:name": imported by whoever calls it."""


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports, anywhere in its body, and external top-level names."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.update(_resolve(module, node))
            if not node.level and node.module:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name if alias.name.startswith("attribution")
                         else alias.name.split(".")[0] for alias in node.names)
    return found


def named_by(module: str) -> set[str]:
    """Project modules whose functions `module` names by a string (`NAMED_FUNCTION`)."""
    return {named.group(1) for node in ast.walk(ast.parse(MODULES[module].read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for named in [NAMED_FUNCTION.fullmatch(node.value)] if named}


IMPORTS = {module: {name for name in imports_of(module) if name in MODULES and name != module}
           for module in MODULES}
"""What each module imports: the edges import cycles are made of."""
GRAPH = {module: IMPORTS[module] | (named_by(module) & set(MODULES)) - {module}
         for module in MODULES}
"""What each module depends on: its imports and the functions it names, which the layer rule
reads (a name is resolved when it is called, so it makes no import cycle)."""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    above = sorted(name for name in GRAPH[module] if layer_of(name) > layer_of(module))
    assert not above, f"{module} ({LAYERS[layer_of(module)]}) imports {above}"


def test_the_package_never_imports_streamlit():
    users = sorted(m for m in MODULES if "streamlit" in imports_of(m))
    assert not users, f"{users} import streamlit"


def test_a_function_named_by_a_string_is_an_import():
    """The jail's tasks name what their children import; the rule sees those edges."""
    assert {"attribution.inputs.model_formats", "attribution.inputs.data_files",
            "attribution.inputs.streaming"} <= GRAPH["attribution.inputs.tasks"]


def test_the_layer_rule_sees_a_violation():
    """The checker itself: an engine module importing an analysis is reported."""
    assert layer_of("attribution.engine.layers") < layer_of("attribution.analyses.pruning_curves")
    assert layer_of("attribution.errors") == 0 and layer_of("attribution.cli") == len(LAYERS) - 1


def test_no_import_cycles():
    """Every strongly connected component of the module graph has one module (packages'
    `__init__` re-exports excluded: importing a package runs it before its modules)."""
    edges = {m: {n for n in IMPORTS[m] if not MODULES[n].name == "__init__.py"} for m in IMPORTS}
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_untrusted_boundary_imports_only_itself_and_the_core():
    """`inputs.untrusted` sits below every loader: the loaders import it, never the reverse
    (the jail runs the task its caller names; it imports none)."""
    boundary = "attribution.inputs.untrusted"
    found = {module: sorted(name for name in GRAPH[module]
                            if not (name == boundary or name.startswith(boundary + ".")
                                    or name in CORE))
             for module in MODULES if module == boundary or module.startswith(boundary + ".")}
    assert len(found) >= 6 and not any(found.values()), found


def _reads_a_zip(node: ast.AST) -> bool:
    """A call `zipfile.ZipFile(...)` / `ZipFile(...)` that opens an archive for reading."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
        node.func, "id", "")
    modes = [arg.value for arg in node.args[1:2] if isinstance(arg, ast.Constant)] + [
        keyword.value.value for keyword in node.keywords
        if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant)]
    return name == "ZipFile" and all(mode == "r" for mode in modes)


def test_only_the_files_module_opens_zip_archives_for_reading():
    """Python's zipfile reads every entry a directory holds: the package opens archives only
    through `untrusted.files.zip_directory`, after its bounded parse of the directory."""
    readers = {module for module, path in MODULES.items()
               if any(_reads_a_zip(node) for node in ast.walk(ast.parse(path.read_text())))}
    assert readers == {"attribution.inputs.untrusted.files"}, readers
