"""What the tests and benchmarks share: models, references, the app and browser drivers, the
hostile-file builders. Test files import from here, never from one another."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (app.py, pages/, demo/, scripts/)."""


def fresh_python(code: str, *arguments: str, timeout: float = 300
                 ) -> subprocess.CompletedProcess:
    """`python -c code arguments` in a fresh interpreter at the repository's root (what a
    process imports at start-up, free of this one's imports), its output captured as text."""
    return subprocess.run([sys.executable, "-c", code, *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
