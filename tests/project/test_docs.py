"""The docs match the code: docs/architecture.md names every module of the package and only
modules that exist, the README stays short, and every relative link leads to a file."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
LAYOUT = DOC[DOC.index("## Layout"):DOC.index("## The layering rule")]


def modules() -> list[Path]:
    return sorted(path for path in (ROOT / "attribution").rglob("*.py")
                  if path.name not in ("__init__.py", "__main__.py"))


def test_every_module_of_the_package_is_in_the_layout():
    missing = [str(path.relative_to(ROOT)) for path in modules()
               if not re.search(rf"\b{re.escape(path.stem)}\b", LAYOUT)]
    assert not missing, f"docs/architecture.md's layout leaves out {missing}"


def package_lines() -> list[str]:
    """The text of each `attribution/...` entry of the layout's block, its continuation lines
    joined, its path and every parenthesised note left out."""
    entries: list[str] = []
    inside = False  # in an `attribution/` entry (a line of another path ends it)
    for line in LAYOUT.split("```")[1].splitlines():
        if line.startswith("attribution/"):
            entries.append(line.split(None, 1)[1] if " " in line.strip() else "")
            inside = True
        elif line.startswith(" ") and inside:
            entries[-1] += " " + line.strip()
        else:
            inside = False
    cleaned = []
    for entry in entries:
        while re.search(r"\([^()]*\)", entry):
            entry = re.sub(r"\([^()]*\)", "", entry)
        cleaned.append(entry)
    return cleaned


def test_every_module_the_layout_lists_exists():
    """Each name listed on a package's entry (`registry (...), shared (...), ...`), with the
    words between them ("one module per family:", "core: no project imports")."""
    stems = {path.stem for path in modules()} | {path.parent.name for path in modules()}
    words = {"one", "module", "per", "family", "core", "no", "project", "imports", "its",
             "init", "main", "docstring", "is", "the", "threat", "model", "index", "front",
             "ends", "untrusted", "input", "boundary"}
    listed = {word.removesuffix(".py") for entry in package_lines()
              for word in re.findall(r"[a-z_]+(?:\.py)?", entry)}
    unknown = sorted(listed - words - stems - {"__init__", "__main__"})
    assert not unknown, f"docs/architecture.md lists modules that do not exist: {unknown}"


README_WORDS = 1800
"""The README stays a front page: the rest lives in docs/."""


def test_the_readme_is_short():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_WORDS, f"README.md has {words} words; move detail to docs/"


def test_every_relative_link_in_the_docs_leads_to_a_file():
    pages = [ROOT / "README.md", ROOT / "demo" / "README.md", *(ROOT / "docs").glob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
