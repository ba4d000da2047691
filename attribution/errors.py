"""The one exception type for mistakes a user can make, and turning a reader's failure on
untrusted bytes into it."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, TypeVar

_NATIVE_PANICS = ("PanicException",)
"""BaseExceptions that report a failure of native code (pyo3's panic in the Rust tokenizers
and safetensors libraries): failures like any Exception. Other BaseExceptions (an interrupt,
a framework's rerun request) pass through."""
Function = TypeVar("Function", bound=Callable)


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
    except BaseException as error:  # noqa: B036 - native code panics as a BaseException
        if not isinstance(error, Exception) and type(error).__name__ not in _NATIVE_PANICS:
            raise
        if "can't allocate memory" in str(error):  # torch's allocator (a RuntimeError)
            raise out_of_memory("the file", error) from None
        detail = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        cause = f" ({type(error).__name__}: {detail})" if detail else ""
        raise AttributionError(problem + cause + (f"; {remedy}" if remedy else ".")) from error


def reads_input(what: str) -> Callable[[Function], Function]:
    """Decorate a public reader of user input (`load_data`, `load_model`) so that every
    failure on the input's bytes, in whichever parser or native library, reaches the caller
    as one AttributionError ("The `what` could not be read (type: detail)")."""
    def decorate(function: Function) -> Function:
        @functools.wraps(function)
        def read(*args, **kwargs):
            with reading(f"The {what} could not be read",
                         "check that it is one of the formats the README lists"):
                return function(*args, **kwargs)
        return read  # type: ignore[return-value]
    return decorate
