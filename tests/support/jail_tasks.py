"""Tasks the jail's tests run in its child (the jail imports them by name): what a file's
parser could try, done on purpose."""
import socket
from pathlib import Path

import numpy as np


def escape(path: str, port: int) -> dict:
    """Try to write `path` and to reach 127.0.0.1:`port`; say which worked."""
    try:
        Path(path).write_text("escaped")
        wrote = True
    except OSError:
        wrote = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        reached = True
    except OSError:
        reached = False
    return {"wrote": wrote, "reached": reached}


def hog(megabytes: int) -> dict:
    """Allocate and touch `megabytes` MB."""
    return {"sum": float(np.ones(megabytes * 250_000, np.float32).sum())}


def arrays() -> dict:
    """Plain arrays of numbers, booleans and text, handed back as .npy files."""
    return {"n": 3, "arrays": {"x": np.arange(6, dtype=np.float32).reshape(2, 3),
                               "ok": np.array([True, False]),
                               "words": np.array(["a", "bc"])}}


WARMED: list = []
"""The sources `warmed` was called with in this process (the server, whose children inherit
it)."""


def warmed(source: str = "") -> dict:
    """As a warm-up (`source` given), note the source; as a task, the sources noted before the
    child forked."""
    if source:
        WARMED.append(source)
    return {"warmed": list(WARMED)}
