"""The jail: untrusted bytes are parsed, tokenized and first run only in a child process.

Threat model. A remote visitor of the dashboard, or the author of a file a batch user is
sent, controls the bytes of a model and a data file (and nothing else). Parsers, tokenizers
and a model's forward are large native programs whose cost and failures the bytes steer: a
catastrophic regex in a tokenizer, a normalizer that expands one character ten million times,
a zip directory of millions of entries, a program whose cost grows with the batch. Checking
each proxy of that cost beside the parser has always left gaps, so the parsers run here:

- inside: every parser, tokenizer and first forward of an unaccepted file (the caller's
  `Task`, a function named "package.module:name"), in a process forked from a server that
  runs, where available, under bubblewrap (`bwrap`: no network, a read-only view of the
  file system but for a scratch folder, its own process and IPC namespaces, killed with its
  parent), and in any case
  under kernel limits: address space (RLIMIT_AS), CPU seconds (RLIMIT_CPU), the size of a
  file it writes (RLIMIT_FSIZE), and wall time (SIGKILL from the parent);
- what crosses back: one JSON line of plain facts (numbers, text, lists) and arrays as
  `.npy` files of numbers or text in a scratch folder, read by `read_array` (its header
  checked against the file's size, no object dtypes), never a pickle. Pickles cross only
  inward, written by this process;
- the server's process then parses only bytes the jail accepted (a model it loaded and ran
  at the batch size the app uses), or holds the arrays it handed back.

Chromium's rule of two (untrusted input, unsafe code, no sandbox: pick two) holds on both
routes: with bubblewrap the parsers meet untrusted input in a sandbox; without it (a plain
child under the same kernel limits, named by `isolation()` wherever the app shows its
status), the child still cannot take the server's memory, time or exceptions, but could
write where its user may and reach the network; install bubblewrap to close that.

Mechanism: a server (`serve` in `python -P`, a fresh interpreter, never a fork of a
threaded Streamlit server) is started once per process; it imports each task's function (and,
started by `warm_up`, loads that task's warm-up files) before it forks one child per request
from its single thread, so children skip those imports. One
request runs at a time, so uploads cannot multiply the budget. POSIX only (fork, setrlimit).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import importlib
import json
import math
import os
import pickle
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ...errors import AttributionError
from .limits import MB

SERVER_COMMAND = (sys.executable, "-P", "-c",
                  f"import sys; from {__name__} import serve; serve(*sys.argv[1:])")
"""The jail's server, given its scratch folder (and a task to warm up with its files)."""
WALL_FACTOR = 3.0
"""A child's wall-clock limit as a multiple of its CPU-time budget: a compute bomb meets the
CPU limit first; the wall limit stops a child that waits, without refusing a sound file on a
machine busy with other work."""
START_SECONDS = 120.0
"""How long the server may take to import torch before a request gives up."""
BUBBLEWRAP = shutil.which("bwrap")
"""The bubblewrap executable, or None: the jail then is a plain child under kernel limits."""
_SANDBOX_OPTIONS = ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent",
                    "--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc")
# All of / is read-only inside (the package or Python itself may live under /tmp, so /tmp is
# not replaced); the scratch folder is the one writable place, and TMPDIR points there.
MAX_ANSWER_BYTES = 16 * MB
"""Bytes of the facts a child hands back as JSON (names, shapes, settings; arrays go through
files under their own budget). Over it the child's answer is refused with its largest
field named, and a longer line from the server stops the server."""
_ARRAY_KINDS = "biufU"  # numbers, booleans and text: what `read_array` accepts
_MESSAGE_CHARS = 2000
_OWN_FILES = ("If the file is genuine and yours, load it on your own machine without the "
              "jail (sandbox=False; --trust-code on the command line), or raise the budget: "
              "Limits(first_run_seconds=..., first_run_memory_bytes=...), or "
              "--first-run-seconds / --first-run-memory-mb.")


@dataclass(frozen=True)
class Task:
    """What the jail runs, by name, so that its server can import it.

    Attributes:
        function: "package.module:name" of a function the child calls as
            `function(**payload)`; it returns a dict of JSON facts, whose "arrays" entry (if
            any) maps names to numpy arrays that cross back as `.npy` files.
        warm_files: paths the server loads with `function(source=path)` once, before the
            first child that names them, so that children inherit what a first load imports
            lazily
            (torch.export's deserializer takes 1-3 s to import: inside a child it would eat
            the child's time budget).
    """

    function: str
    warm_files: tuple[str, ...] = ()

    def __post_init__(self):
        module, _, name = self.function.partition(":")
        if not (module and name.isidentifier()):
            raise ValueError(f"Task.function must be 'package.module:name', not "
                             f"{self.function!r}.")


@dataclass(frozen=True)
class Budget:
    """A child's budget, and the words of its refusals.

    Attributes:
        seconds: CPU time the child may use (RLIMIT_CPU); it may take `WALL_FACTOR` times
            as long in wall-clock time from its fork (a busy machine, or a child that only
            waits), then it is killed.
        memory_bytes: address space above the server's footprint.
        file_bytes: the largest file the child may write (its arrays).
        work: what the child had to do, as a phrase that starts a sentence ("Loading the
            model and running a batch of 3 samples").
        name: the budget's name in refusals ("a first run").
    """

    seconds: float
    memory_bytes: int
    file_bytes: int
    work: str
    name: str

    @property
    def wall_seconds(self) -> float:
        return self.seconds * WALL_FACTOR


@dataclass(frozen=True)
class Answer:
    """What the child handed back: `message` is None when it succeeded; `peak_bytes` is its
    peak RSS and `start_bytes` its RSS as its work began (what it inherited from the server),
    so `peak_bytes - start_bytes` is what the file cost."""

    message: Optional[str]
    facts: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)
    seconds: float = 0.0
    peak_bytes: int = 0
    start_bytes: int = 0


def run(task: Task, payload: dict, budget: Budget) -> Answer:
    """Run `task` on `payload` (picklable; it goes in, never comes back) in a child within
    `budget`; the child's facts and arrays, or its message when it failed."""
    return _SERVER.request(task, payload, budget)


def check(task: Task, payload: dict, budget: Budget) -> Answer:
    """`run`, raising AttributionError with the child's message when it failed."""
    answer = run(task, payload, budget)
    if answer.message is not None:
        raise AttributionError(answer.message)
    return answer


def warm_up(task: Task, *more_files: str) -> None:
    """Start the server now, if it is not running, warmed up with `task` and `more_files`
    (it imports torch and loads them in the background), e.g. while a visitor chooses
    files."""
    with _SERVER.lock:
        _SERVER.running(warm=(task, more_files))


def isolation() -> str:
    """How untrusted files are isolated here, in words for a status line."""
    if BUBBLEWRAP and _bubblewrap_works():
        return ("bubblewrap (no network, read-only file system) and kernel limits on memory, "
                "CPU and time")
    return ("a child process under kernel limits on memory, CPU and time; bubblewrap is not "
            "available here, so the child is not cut off from the network and the file "
            "system (install the bubblewrap package)")


def tighten(extra_bytes: int) -> None:
    """In a jail's child, lower its address-space limit to its present size plus
    `extra_bytes`, before work whose cost is known (tokenizing N rows); outside one, nothing.
    A limit can only be lowered, so the work cannot take back what the file's budget gave."""
    size = _address_space()
    if _IN_CHILD and size is not None:
        ceiling = min(size + extra_bytes, resource.getrlimit(resource.RLIMIT_AS)[0])
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))


def read_array(path: Path, max_bytes: int) -> np.ndarray:
    """The array in the `.npy` file `path` written by the jail: numbers, booleans or text
    only, its header's shape and dtype matching the file's size, at most `max_bytes`."""
    with open(path, "rb") as stream:
        try:
            version = np.lib.format.read_magic(stream)
            reader = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}[version]
            shape, fortran, dtype = reader(stream)
        except (ValueError, KeyError, SyntaxError) as error:
            raise AttributionError(f"The jail handed back a malformed array ({error}).") \
                from None
        count = math.prod(shape)
        remaining = os.fstat(stream.fileno()).st_size - stream.tell()
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or dtype.fields is not None \
                or count * dtype.itemsize != remaining or remaining > max_bytes:
            raise AttributionError("The jail handed back an array that is not plain numbers "
                                   "or text of its stated size.")
        array = np.fromfile(stream, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran else "C")


# ------------------------------------------------------------------ the server's side

_BUBBLEWRAP_WORKS: Optional[bool] = None
_IN_CHILD = False
_START_BYTES: Optional[int] = None


def _bubblewrap_works() -> bool:
    """Can bubblewrap start a sandbox here (it needs user namespaces or root)? Asked once."""
    global _BUBBLEWRAP_WORKS
    if _BUBBLEWRAP_WORKS is None:
        try:
            _BUBBLEWRAP_WORKS = subprocess.run(
                [BUBBLEWRAP, *_SANDBOX_OPTIONS, "--", "true"], capture_output=True,
                timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _BUBBLEWRAP_WORKS = False
    return _BUBBLEWRAP_WORKS


class _Server:
    """The jail's server process; one conversation at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: Optional[subprocess.Popen] = None
        self.scratch: Optional[Path] = None
        self.ready = False
        self.buffer = bytearray()
        self.requests = 0

    def running(self, warm: Optional[tuple[Task, tuple[str, ...]]] = None
                ) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            root = str(Path(__file__).resolve().parents[3])  # the folder holding the package
            self.scratch = Path(tempfile.mkdtemp(prefix="attribution-jail-"))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                TMPDIR=str(self.scratch), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
                RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
                TRANSFORMERS_OFFLINE="1", HF_HOME=str(self.scratch / "cache"),
                XDG_CACHE_HOME=str(self.scratch / "cache"))
            command = [*SERVER_COMMAND, str(self.scratch)]
            if warm is not None:
                command += [warm[0].function, *warm[0].warm_files, *warm[1]]
            if BUBBLEWRAP and _bubblewrap_works():
                scratch = str(self.scratch)
                command = [BUBBLEWRAP, *_SANDBOX_OPTIONS, "--bind", scratch, scratch,
                           "--chdir", root, "--", *command]
            self.process = _LAUNCHER.submit(
                subprocess.Popen, command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env=env, cwd=root, stderr=subprocess.DEVNULL,  # answers carry all
                close_fds=True).result()
            self.ready, self.buffer = False, bytearray()
        return self.process

    def request(self, task: Task, payload: dict, budget: Budget) -> Answer:
        with self.lock:
            self.requests += 1
            answer = self._send({"function": task.function, "warm_files": task.warm_files,
                                 "payload": payload, "budget": budget,
                                 "folder": str(self.requests)},
                                budget.wall_seconds + START_SECONDS)
            folder = self.scratch / str(self.requests)
            try:
                arrays = {name: read_array(folder / f"{index}.npy", budget.file_bytes)
                          for index, name in enumerate(answer.get("arrays", ()))
                          if answer.get("message") is None}
            except OSError as error:
                raise AttributionError(f"The jail's answer could not be read ({error}).") \
                    from None
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        message = answer.get("message")
        return Answer(None if message is None else str(message)[:_MESSAGE_CHARS],
                      answer.get("facts") or {}, arrays, float(answer.get("seconds", 0.0)),
                      int(answer.get("peak_bytes", 0)), int(answer.get("start_bytes", 0)))

    def _send(self, request: dict, timeout: float) -> dict:
        process = self.running()
        try:
            if not self.ready:
                self._line(process, START_SECONDS)
                self.ready = True
            data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
            process.stdin.write(len(data).to_bytes(8, "little") + data)
            process.stdin.flush()
            return self._line(process, timeout)
        except (OSError, ValueError, TimeoutError) as error:
            self.stop()
            raise AttributionError(f"The file could not be checked: the jail's process failed "
                                   f"({type(error).__name__}: {error}). Try again; if it "
                                   "keeps failing, report it.") from None
        except BaseException:  # interrupted mid-conversation: start afresh next time
            self.stop()
            raise

    def _line(self, process: subprocess.Popen, timeout: float) -> dict:
        """The server's next JSON line, within `timeout` seconds and `_LINE_BYTES`, read in
        linear time (each byte searched once)."""
        deadline = time.monotonic() + timeout
        descriptor = process.stdout.fileno()
        searched = 0
        while (end := self.buffer.find(b"\n", searched)) < 0:
            searched = len(self.buffer)
            if searched > _LINE_BYTES:
                raise ValueError(f"an answer of more than {_LINE_BYTES:,} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer within {timeout:.0f} s")
            readable, _, _ = select.select([descriptor], [], [], remaining)
            if readable:
                chunk = os.read(descriptor, 1 << 20)
                if not chunk:
                    raise OSError(f"the server exited with code {process.wait()}")
                self.buffer += chunk
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        return json.loads(line)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="jail-launcher")
"""The one thread that starts the server, alive as long as this process: bubblewrap's
--die-with-parent kills the server when the *thread* that started it ends (the kernel's
parent-death signal is per thread), and Streamlit runs every script run in a thread of its
own, so a server started by a page would die with that run and start again, 2-4 s, on the
next upload."""
_SERVER = _Server()
atexit.register(_SERVER.stop)


# ------------------------------------------------------------------ the server and its children

def serve(scratch: str, warm: Optional[str] = None, *warm_files: str) -> None:
    """The server's loop (`SERVER_COMMAND`): import the task `warm` and load `warm_files`
    with it, then read length-prefixed pickled requests on stdin and answer each with one
    JSON line, until stdin closes; each request runs in a child whose arrays go under
    `scratch`."""
    try:
        _serve(scratch, warm, warm_files)
    except BrokenPipeError:  # the parent exited while this was starting or answering
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing to flush
        sys.exit(0)


def _serve(scratch: str, warm: Optional[str], warm_files: tuple[str, ...]) -> None:
    import torch

    torch.set_num_threads(1)  # no thread pool before forking (a forked pool would hang)
    functions: dict[str, Any] = {}
    warmed: set[tuple[str, str]] = set()

    def imported(function: str, files: Sequence[str]) -> Any:
        """The task's function, each of its warm-up `files` loaded once (what they import
        lazily is then imported before the first child that asks for them forks)."""
        if function not in functions:
            module, _, name = function.partition(":")
            functions[function] = getattr(importlib.import_module(module), name)
        for path in files:
            if (function, path) not in warmed:
                warmed.add((function, path))
                try:
                    functions[function](source=path)
                except Exception:  # noqa: BLE001 (a warm-up only saves time)
                    pass
        return functions[function]

    if warm is not None:
        imported(warm, warm_files)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    answers.write(b'{"ready": true}\n')
    answers.flush()
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        request = pickle.loads(requests.read(int.from_bytes(header, "little")))
        folder = Path(scratch) / request["folder"]
        folder.mkdir()
        answer = _run_child(imported(request["function"], request["warm_files"]), request,
                            folder)
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()


def _run_child(function: Any, request: dict, folder: Path) -> dict:
    """Fork a child that runs `function` on the request's payload; kill it when over time."""
    budget: Budget = request["budget"]
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here
        try:
            os.close(read_end)
            try:
                data = json.dumps(_child(function, request["payload"], budget, folder))
            except BaseException as error:  # noqa: BLE001 (anything the file does is reported)
                data = json.dumps({"message": _failure(error, budget), **_peaks()})
            data = data.encode()
            while data:
                data = data[os.write(write_end, data):]
        finally:
            os._exit(0)
    os.close(write_end)
    chunks, timed_out, received = [], False, 0
    while True:
        remaining = started + budget.wall_seconds - time.monotonic()
        readable = select.select([read_end], [], [], max(remaining, 0))[0]
        if not readable:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(read_end, 1 << 20)
        if not chunk:
            break
        received += len(chunk)
        if received > _LINE_BYTES:  # the child checks its own answer: this one did not
            os.kill(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            os.close(read_end)
            return {"message": f"{budget.work} answered with more than {_LINE_BYTES:,} "
                               "bytes; it was stopped."}
        chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    os.close(read_end)
    measured = {"seconds": time.monotonic() - started, "peak_bytes": usage.ru_maxrss * 1024}
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return dict(measured, message=(
            f"{budget.work} took more than {round(budget.seconds, 1):g} s of computing, the "
            f"time budget of {budget.name}; it was stopped. {_OWN_FILES}"))
    if timed_out:
        return dict(measured, message=(
            f"{budget.work} took longer than {round(budget.wall_seconds, 1):g} s, "
            f"{WALL_FACTOR:g} times the time budget of {budget.name}; it was stopped. "
            f"{_OWN_FILES}"))
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ:
        return dict(measured, message=(
            f"{budget.work} produced more than {budget.file_bytes / MB:,.0f} MB of data; if "
            "the file is genuine and yours, raise Limits(max_decoded_bytes=...)."))
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
        return dict(measured, message=(
            f"{budget.work} made native code abort, as it does when it runs past its memory "
            f"budget ({budget.memory_bytes / MB:,.0f} MB for {budget.name}, less where the "
            f"work's own cost is known); this file cannot be used here. {_OWN_FILES}"))
    if os.WIFSIGNALED(status) or not chunks:
        return dict(measured, message=(
            f"{budget.work} crashed the program (signal "
            f"{os.WTERMSIG(status) if os.WIFSIGNALED(status) else 'none'}); this file cannot "
            "be used here."))
    return dict(measured, **json.loads(b"".join(chunks)))  # with the child's own peak


def _child(function: Any, payload: dict, budget: Budget, folder: Path) -> dict:
    """In the forked child: set the limits, run `function`, write its arrays; the report."""
    global _IN_CHILD
    _IN_CHILD = True
    address_space = _address_space()
    if address_space is not None:
        ceiling = address_space + budget.memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    cpu = max(1, math.ceil(budget.seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (budget.file_bytes, budget.file_bytes))
    os.chdir(folder)
    global _START_BYTES
    _START_BYTES = _status_field("VmHWM", reset=True)  # the peak from here on is its own
    facts = dict(function(**payload))
    arrays = facts.pop("arrays", {}) or {}
    _check_answer_size(facts, budget)
    for index, array in enumerate(arrays.values()):
        np.save(folder / f"{index}.npy", np.ascontiguousarray(array), allow_pickle=False)
    return {"message": None, "facts": facts, "arrays": list(arrays), **_peaks()}


_LINE_BYTES = MAX_ANSWER_BYTES + 64 * 1024
"""The longest line read from the server or a child: the facts' budget and the envelope."""


def _check_answer_size(facts: dict, budget: Budget) -> None:
    """Refuse facts whose JSON exceeds MAX_ANSWER_BYTES, naming the largest field."""
    sizes = {key: len(json.dumps(value)) for key, value in facts.items()}
    if sum(sizes.values()) > MAX_ANSWER_BYTES:
        field = max(sizes, key=sizes.get)
        raise AttributionError(
            f"{budget.work}: the file's {field.replace('_', ' ')} take {sizes[field]:,} bytes "
            f"as text, over the {MAX_ANSWER_BYTES // MB} MB that names and settings may take; "
            "shorten them (a name is a label, not a document).")


def _failure(error: BaseException, budget: Budget) -> str:
    """The message for an exception in the child."""
    text = str(error)
    if isinstance(error, MemoryError) or "can't allocate memory" in text or \
            "out of memory" in text or "Cannot allocate memory" in text:
        return (f"{budget.work} needed more than {budget.memory_bytes / MB:,.0f} MB, the "
                f"memory budget of {budget.name}; it was stopped. {_OWN_FILES}")
    if isinstance(error, AttributionError):
        return text
    first = text.strip().splitlines()[0][:300] if text.strip() else ""
    return f"{budget.work} failed ({type(error).__name__}{': ' + first if first else ''})."


def _peaks() -> dict:
    """The child's peak RSS and its RSS as its work began, where known."""
    peak = _status_field("VmHWM")
    if peak is None or _START_BYTES is None:
        return {}
    return {"peak_bytes": peak, "start_bytes": _START_BYTES}


def _address_space() -> Optional[int]:
    """This process's virtual memory size in bytes (Linux), or None where unknown."""
    return _status_field("VmSize")


def _status_field(name: str, reset: bool = False) -> Optional[int]:
    """A size in bytes from /proc/self/status (Linux), or None where unknown; with `reset`,
    first restart the peak RSS (VmHWM) from the present RSS, as a fork inherits its
    parent's peak."""
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
