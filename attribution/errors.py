"""The one exception type for mistakes a user can make, and turning a reader's failure on
untrusted bytes into it."""
from __future__ import annotations

import contextlib
from typing import Iterator


class AttributionError(ValueError):
    """A problem with the user's model, data or arguments; the message says what to do."""


def out_of_memory(name: str, error: BaseException) -> AttributionError:
    """A MemoryError while reading `name`, as a message with the size that was attempted."""
    attempted = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return AttributionError(
        f"Reading {name} ran out of memory" + (f" ({attempted})" if attempted else "")
        + ". The file asks for more memory than this machine has; use a smaller file, or "
        "on your own machine the command line with a memory-mapped .npy.")


@contextlib.contextmanager
def reading(problem: str, remedy: str = "") -> Iterator[None]:
    """Turn any failure of a parser on untrusted bytes into one AttributionError:
    "`problem` (its type: its first line)", then "; `remedy`" when given."""
    try:
        yield
    except AttributionError:
        raise
    except MemoryError as error:
        raise out_of_memory("the file", error) from None
    except Exception as error:
        if "can't allocate memory" in str(error):  # torch's allocator (a RuntimeError)
            raise out_of_memory("the file", error) from None
        detail = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        cause = f" ({type(error).__name__}: {detail})" if detail else ""
        raise AttributionError(problem + cause + (f"; {remedy}" if remedy else ".")) from error
