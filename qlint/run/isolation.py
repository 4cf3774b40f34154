"""Run one unit of work in a child process: its exit, crash, hang or memory blow-up is an error line.

A target's factory is model code from the repository: it may call `sys.exit(0)`,
`os._exit`, crash the interpreter or never return, and whatever it imports stays
imported. A `.pte` is decoded by unpacking its flatbuffer, where one table can be
referenced many times over. Each target and each `.pte` therefore runs in a child
of its own (with `--jobs`, every artifact does), forked from a forkserver that has
already imported torch and ExecuTorch, so a child starts in a fraction of a second.
The child gets a memory budget on top of that loaded stack, and the parent waits
with a timeout: a child that ends without a result is one error naming the unit.
This isolates a run's result from its inputs; it is not a sandbox: factories run
with the permissions of the user running qlint.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from qlint.io.limits import Limits
from qlint.io.reads import first_line
from qlint.records.results import InputError, Report

_PRELOAD = ["qlint.run.preload"]
_context: Any = None
# The children running now, and whether the run was interrupted (no new child then).
_running: set[Any] = set()
_lock = threading.Lock()
_stopped = threading.Event()


def _get_context() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def warm_up() -> None:
    """Start the forkserver now: it imports torch and ExecuTorch (seconds) while the
    caller does other work, instead of when the first child is needed."""
    import multiprocessing.forkserver

    _get_context()
    multiprocessing.forkserver.ensure_running()


def run_isolated(function: Callable[..., Report], args: tuple[Any, ...], *, name: str, limits: Limits,
                 verbose: bool = False) -> Report:
    """`function(*args)` in a child process; a Report of one error if it does not return one
    within `limits.timeout_s`, or runs out of its `limits.memory_mb` budget."""
    context = _get_context()
    receiver, sender = context.Pipe(duplex=False)
    budget = int(limits.memory_mb * (1 << 20))
    child = context.Process(
        target=_child, args=(sender, name, function, args, dict(os.environ), verbose, budget), daemon=True
    )
    timeout = limits.timeout_s
    with _lock:
        if _stopped.is_set():
            sender.close()
            receiver.close()
            return _error(name, "not started: the run was interrupted")
        child.start()
        _running.add(child)
    sender.close()
    try:
        if not receiver.poll(timeout):
            return _error(name, f"did not finish within {timeout:g} s (limits.timeout_s in .qlint.yaml); stopped")
        try:
            result = receiver.recv()
        except (EOFError, OSError):
            child.join(10)
            return _error(name, f"its process ended without a result ({_exit_status(child.exitcode)})")
        if not isinstance(result, Report):
            return _error(name, "its process sent something other than a report")
        return result
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join(10)
        with _lock:
            _running.discard(child)


def stop_children() -> None:
    """Kill every running child and start no more (Ctrl-C): the threads that wait on them
    return at once instead of at the timeout, and the interrupted run can end."""
    with _lock:
        _stopped.set()
        running = list(_running)
    for child in running:
        child.kill()


def allow_children() -> None:
    """A new run may start children again."""
    _stopped.clear()


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _error(name: str, message: str) -> Report:
    return Report(errors=[InputError(name, message)])


def _child(
    sender: Any,
    name: str,
    function: Callable[..., Report],
    args: tuple[Any, ...],
    environ: dict[str, str],
    verbose: bool,
    budget: int,
) -> None:
    """The child's side: the parent's environment, a memory budget on top of the loaded
    stack, and model output kept off the report's stdout."""
    os.environ.clear()
    os.environ.update(environ)
    _limit_memory(budget)
    # Whatever a factory prints must not corrupt json/sarif on stdout: it goes
    # to stderr with --verbose, else nowhere.
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(os.devnull, os.O_WRONLY) if not verbose else os.dup(2)
    os.dup2(target, 1)
    if not verbose:
        os.dup2(target, 2)
    os.close(target)
    try:
        result = function(*args)
    except SystemExit as exc:
        result = _error(name, f"called sys.exit({exc.code!r}) instead of returning")
    except MemoryError:
        result = _error(
            name, f"needed more than its {budget >> 20} MiB memory budget (limits.memory_mb in .qlint.yaml)"
        )
    except BaseException as exc:  # noqa: BLE001 - the child reports, the parent decides

        result = _error(name, f"internal error: {type(exc).__name__}: {first_line(exc)}")
    try:
        sender.send(result)
    finally:
        sender.close()


def _limit_memory(budget: int) -> None:
    """Cap the child's address space at what it has mapped now (torch loaded) plus `budget`."""
    with open("/proc/self/status") as status:
        mapped = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:")), None)
    if mapped is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
