"""What the tests and benchmarks share: models, references, the app and browser drivers, the
hostile-file builders. Test files import from here, never from one another."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (app.py, pages/, demo/, scripts/)."""
