"""`python -m attribution ...` (see `attribution.cli`)."""
import sys

from .cli import main

sys.exit(main())
