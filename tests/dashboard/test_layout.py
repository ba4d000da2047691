"""The dashboard's layout, read from its source (`ast`): the page scripts are exactly app.py's
pages and only draw (no torch, no autograd or hooks, no engine), and the shared modules that
need no streamlit import none."""
import ast
import sys

import pytest

from tests.support import ROOT, fresh_python

PAGES_DIR = ROOT / "pages"
SHARED = PAGES_DIR / "shared"
PAGE_SCRIPTS = sorted(PAGES_DIR.glob("*.py"))
WITHOUT_STREAMLIT = ("figures", "keys", "curve_states")
# what a page may import from attribution: its front (the package itself), the results and
# their words (analyses, presentation) and the core; never the engine, the methods or the
# loaders (models and data come through pages.shared.workspace)
ATTRIBUTION_ALLOWED = ("attribution.analyses", "attribution.presentation",
                       "attribution.progress", "attribution.errors")  # and `attribution`
THIRD_PARTY_ALLOWED = {"numpy", "pandas", "streamlit"}
# attributes of autograd and hooks: a page that names one computes instead of drawing
FORBIDDEN_ATTRIBUTES = {"backward", "autograd", "grad", "no_grad", "enable_grad",
                        "register_hook", "register_forward_hook", "register_forward_pre_hook",
                        "register_full_backward_hook", "register_full_backward_pre_hook",
                        "register_backward_hook"}


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an `import` or `from ... import` names, anywhere in the file."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, "a page imports by absolute name"
            found.add(node.module)
    return found


def app_pages() -> set[str]:
    """The scripts app.py lists with st.Page("pages/....py", ...)."""
    tree = ast.parse((ROOT / "app.py").read_text())
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Page" and node.args
            and isinstance(node.args[0], ast.Constant)}


def test_the_pages_folder_holds_exactly_app_pys_pages():
    """Streamlit's folder navigation (before st.navigation first runs) makes a page of every
    pages/*.py: a shared module there would be one. Subfolders are not read."""
    assert {f"pages/{path.name}" for path in PAGE_SCRIPTS} == app_pages()
    assert len(PAGE_SCRIPTS) == 7 and (SHARED / "__init__.py").exists()


@pytest.mark.parametrize("path", PAGE_SCRIPTS, ids=lambda path: path.name)
def test_each_page_first_makes_sure_app_py_ran(path):
    body = [node for node in ast.parse(path.read_text()).body
            if not isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    first = body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
    assert ast.unparse(first.value) == "require_entrypoint()"


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "attribution":
        return module == "attribution" or any(
            module == allowed or module.startswith(allowed + ".")
            for allowed in ATTRIBUTION_ALLOWED)
    if top == "pages":
        return module.startswith("pages.shared.")
    return top in THIRD_PARTY_ALLOWED or top in sys.stdlib_module_names


@pytest.mark.parametrize("path", PAGE_SCRIPTS, ids=lambda path: path.name)
def test_pages_only_draw(path):
    tree = ast.parse(path.read_text())
    modules = imported_modules(tree)
    assert not {m for m in modules if m.split(".")[0] == "torch"}, "a page imports torch"
    assert all(_allowed(module) for module in modules), \
        sorted(module for module in modules if not _allowed(module))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "torch" not in names
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not attributes & FORBIDDEN_ATTRIBUTES, sorted(attributes & FORBIDDEN_ATTRIBUTES)


def test_the_check_would_see_what_a_page_must_not_do():
    """The checks above, on a page that computes: each breach is seen."""
    tree = ast.parse("import torch\nfrom attribution.engine.runners import hook\n"
                     "loss.backward()\nlayer.register_forward_hook(f)\n")
    modules = imported_modules(tree)
    assert "torch" in modules and not _allowed("attribution.engine.runners")
    assert not _allowed("attribution.inputs.data") and not _allowed("attribution.methods")
    assert _allowed("attribution.presentation.plots") and _allowed("pages.shared.draw")
    assert not _allowed("pages.common") and not _allowed("plotly")
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert attributes & FORBIDDEN_ATTRIBUTES == {"backward", "register_forward_hook"}


@pytest.mark.parametrize("name", WITHOUT_STREAMLIT)
def test_modules_that_need_no_streamlit_import_none(name):
    tree = ast.parse((SHARED / f"{name}.py").read_text())
    assert not {m for m in imported_modules(tree) if m.split(".")[0] == "streamlit"}
    # nor through another shared module
    assert not {m for m in imported_modules(tree)
                if m.startswith("pages.shared.") and m.split(".")[2] not in WITHOUT_STREAMLIT}


def test_importing_them_loads_no_streamlit():
    code = ("import sys\n"
            + "".join(f"import pages.shared.{name}\n" for name in WITHOUT_STREAMLIT)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'streamlit'))\n")
    result = fresh_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
