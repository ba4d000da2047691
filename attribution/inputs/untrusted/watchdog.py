"""The first load and run of an untrusted model, in a child process with a time and memory budget.

Threat: a model file can be small and still legal yet ruinous to run: a 10 KB .pt2 whose graph
allocates a 12000x12000 matrix per call, an endless `while_loop`, a state dict whose
architecture convolves a 4096x4096 image through many layers. Parsing budgets cannot see that;
only running it does. The caller (`attribution.inputs.loading.load_model`) therefore has an
uploaded model loaded and probed (batches of 1 and 3 samples) first in a child process, and
loads it itself only after the child succeeded. Budget (`Limits`, defaults):
- time: `first_run_seconds` (5 s) of wall-clock time from the child's start, after which it
  is killed (SIGKILL), backed by RLIMIT_CPU; the child runs one intra-op thread, so a compute
  bomb holds at most one core;
- memory: `first_run_memory_bytes` (1000 MB) of address space above the child's start
  (RLIMIT_AS), so an allocation past it fails inside the child;
- at most one first run at a time (others wait), so uploads cannot multiply the budget.

This module is only the jail: what runs inside it is the caller's `Loader`, named by an
importable "module:function" and given the files that warm the server up, so nothing here
imports the loaders (they import this module).

Mechanism: a checking server (`python -P -m attribution.inputs.untrusted.watchdog FUNCTION
[WARM FILE ...]`, started once per process and loader with subprocess, i.e. a fresh
interpreter: never a fork of a threaded Streamlit server, and no re-import of the caller's
`__main__` as multiprocessing's spawn would do) imports torch and the loader once, loads the
warm-up files with it (for `load_model`, the shipped demo .pt2 and Hugging Face folder, so
torch.export's lazily loaded internals and transformers are imported before any fork), then
forks one child per check from its single thread. Overhead: starting the server takes 3-13 s
on a busy 2-core machine, once per process (`warm_up()` starts it early); each check then
costs a fork plus loading the model twice (child and parent), about 0.1-0.5 s for small
models. Requests go to the server as pickles written by this process; answers come back as
JSON, so a compromised child cannot make the parent unpickle anything. POSIX only (fork,
setrlimit).
"""
from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ...errors import AttributionError
from .limits import MB, Limits

START_SECONDS = 120.0
"""How long the server may take to import torch before a check gives up."""
_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class Loader:
    """What the jail runs, by name, so that the checking server can import it.

    Attributes:
        function: "package.module:name" of a function the child calls as
            `function(model, limits=limits, **options)` on the model file's bytes; the
            `n_classes` of what it returns, if any, is reported.
        warm_files: paths the server loads once with `function(path)` before it forks any
            child, so that every child inherits what a first load imports lazily.
    """

    function: str
    warm_files: tuple[str, ...] = ()

    def __post_init__(self):
        module, _, name = self.function.partition(":")
        if not (module and name.isidentifier()):
            raise ValueError(f"Loader.function must be 'package.module:name', not "
                             f"{self.function!r}.")


@dataclass(frozen=True)
class FirstRunReport:
    """What the child reported: `message` is None when the model loaded and ran."""

    message: Optional[str]
    n_classes: Optional[int]
    seconds: float
    peak_bytes: int


def first_run(model: bytes, loader: Loader, *, limits: Limits,
              **options: Any) -> FirstRunReport:
    """Load `model` with `loader` and run it in a child within `limits`.

    Args:
        model: the model file's bytes.
        loader: the function the child runs, and the server's warm-up files.
        limits: the budgets (`first_run_seconds`, `first_run_memory_bytes`, and the decoding
            budgets the child's loader applies).
        options: further arguments of the loader (for `load_model`: architecture as a
            description, not code; example_input, class_names, ...), picklable.
    Returns:
        the child's FirstRunReport: its message says why the model was refused, or is None.
    """
    return _SERVER.check(loader, {"model": model, "limits": limits, "options": options},
                         limits)


def check_first_run(model: bytes, loader: Loader, *, limits: Limits,
                    **options: Any) -> FirstRunReport:
    """`first_run`, raising AttributionError with the child's message on refusal."""
    report = first_run(model, loader, limits=limits, **options)
    if report.message is not None:
        raise AttributionError(report.message)
    return report


def warm_up(loader: Loader) -> None:
    """Start the checking server for `loader` now (it imports torch in the background)."""
    with _SERVER.lock:
        _SERVER.running(loader)


# ------------------------------------------------------------------ the parent's side

class _Server:
    """The checking server process, for one loader at a time; one conversation at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: Optional[subprocess.Popen] = None
        self.loader: Optional[Loader] = None
        self.ready = False
        self.buffer = b""

    def running(self, loader: Loader) -> subprocess.Popen:
        if self.process is not None and self.loader != loader:
            self.stop()  # started for another loader
        if self.process is None or self.process.poll() is not None:
            root = str(Path(__file__).resolve().parents[3])  # the folder holding the package
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "attribution.inputs.untrusted.watchdog",
                 loader.function, *map(str, loader.warm_files)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env=env, cwd=root, close_fds=True)
            self.loader, self.ready, self.buffer = loader, False, b""
        return self.process

    def check(self, loader: Loader, request: dict, limits: Limits) -> FirstRunReport:
        with self.lock:
            process = self.running(loader)
            try:
                if not self.ready:
                    self._line(process, START_SECONDS)
                    self.ready = True
                payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
                process.stdin.write(len(payload).to_bytes(8, "little") + payload)
                process.stdin.flush()
                answer = self._line(process, limits.first_run_seconds + START_SECONDS)
            except (OSError, ValueError, TimeoutError) as error:
                self.stop()
                raise AttributionError(f"The model could not be checked: the checking process "
                                       f"failed ({type(error).__name__}: {error}). Try again; "
                                       "if it keeps failing, report it.") from None
            except BaseException:  # interrupted mid-conversation: start afresh next time
                self.stop()
                raise
        return FirstRunReport(answer.get("message"), answer.get("n_classes"),
                              float(answer.get("seconds", 0.0)),
                              int(answer.get("peak_bytes", 0)))

    def _line(self, process: subprocess.Popen, timeout: float) -> dict:
        """The server's next JSON line, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        descriptor = process.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer within {timeout:.0f} s")
            readable, _, _ = select.select([descriptor], [], [], remaining)
            if readable:
                chunk = os.read(descriptor, 65536)
                if not chunk:
                    raise OSError(f"the server exited with code {process.wait()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


_SERVER = _Server()


# ------------------------------------------------------------------ the server and its children

def _serve(function: str, warm_files: list[str]) -> None:
    """Import the loader `function` ("module:name") and load `warm_files` with it; then read
    length-prefixed pickled requests on stdin and answer each with one JSON line."""
    import torch

    module, _, name = function.partition(":")
    load = getattr(importlib.import_module(module), name)
    torch.set_num_threads(1)  # no thread pool before forking (a forked pool would hang)
    for path in warm_files:  # imports what the loader imports lazily, once, for every child
        if Path(path).exists():
            load(path)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    answers.write(b'{"ready": true}\n')
    answers.flush()
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        request = pickle.loads(requests.read(int.from_bytes(header, "little")))
        answers.write(json.dumps(_run_child(load, request)).encode() + b"\n")
        answers.flush()


def _run_child(load: Any, request: dict) -> dict:
    """Fork a child that loads and probes the model; kill it when over time."""
    limits: Limits = request["limits"]
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        try:
            report = _child(load, request)
        except BaseException as error:  # noqa: BLE001 (anything the model does is reported)
            report = {"message": _failure(error, limits)}
        data = json.dumps(report).encode()
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks, timed_out = [], False
    while True:
        remaining = started + limits.first_run_seconds - time.monotonic()
        readable = select.select([read_end], [], [], max(remaining, 0))[0]
        if not readable:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    os.close(read_end)
    seconds = time.monotonic() - started
    peak = usage.ru_maxrss * 1024
    measured = {"seconds": seconds, "peak_bytes": peak}
    if timed_out or os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return dict(measured, message=(
            f"The model did not load and run a batch of 3 samples within "
            f"{limits.first_run_seconds:g} s, the time budget of a first run; it was "
            "stopped. Check its size and its loops; for a genuinely slow model, load it on "
            "your own machine (sandbox=False, or a path) or raise "
            "Limits(first_run_seconds=...)."))
    if os.WIFSIGNALED(status) or not chunks:
        return dict(measured, message=(
            f"The model crashed while loading or running its first batch (signal "
            f"{os.WTERMSIG(status) if os.WIFSIGNALED(status) else 'none'}); this file cannot "
            "be used here."))
    report = json.loads(b"".join(chunks))
    message = report.get("message")
    return dict(measured, message=None if message is None else str(message)[:_MESSAGE_CHARS],
                n_classes=report.get("n_classes"))


def _child(load: Any, request: dict) -> dict:
    """In the forked child: set the budget, load (and probe) with `load`; the report."""
    limits: Limits = request["limits"]
    address_space = _address_space()
    if address_space is not None:
        ceiling = address_space + limits.first_run_memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    cpu = math.ceil(limits.first_run_seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    import torch

    torch.set_num_threads(1)
    loaded = load(request["model"], limits=limits, **request["options"])
    n_classes = getattr(loaded, "n_classes", None)
    return {"n_classes": n_classes if isinstance(n_classes, int) else None}


def _failure(error: BaseException, limits: Limits) -> str:
    """The message for an exception in the child."""
    text = str(error)
    if isinstance(error, MemoryError) or "can't allocate memory" in text or \
            "out of memory" in text:
        return (f"The model needed more than {limits.first_run_memory_bytes / MB:,.0f} MB, "
                "the memory budget of a first run, to load and run a batch of 3 samples; it "
                "was stopped. For a genuinely large model, load it on your own machine "
                "(sandbox=False, or a path) or raise Limits(first_run_memory_bytes=...).")
    if isinstance(error, AttributionError):
        return text
    first = text.strip().splitlines()[0][:300] if text.strip() else ""
    return (f"The model failed while loading or running its first batch "
            f"({type(error).__name__}{': ' + first if first else ''}).")


def _address_space() -> Optional[int]:
    """This process's virtual memory size in bytes (Linux), or None where unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


if __name__ == "__main__":
    try:
        _serve(sys.argv[1], sys.argv[2:])
    except BrokenPipeError:  # the server exited while this was starting or answering
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing to flush
        sys.exit(0)
