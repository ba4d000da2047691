"""Where the files that ship beside the package are: the demo folder (`demo/`, made by
`scripts/make_demo.py`). Here, below the loaders, so that both the demo (`inputs.demo`,
which loads through them) and the loaders (which warm the jail with two demo files) can
name it."""
from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
