"""What a long-running lab command needs around its loop: signals and a progress bar.

* ``SignalStop``: while active (a context manager), SIGINT and SIGTERM only note the first
  signal (``signum``), so the loop can finish its step and checkpoint; a second one stops at
  once. The previous handlers come back on exit. Main thread only (elsewhere a no-op).
* ``Progress``: a rich progress bar (step, loss, tokens/s, ETA), a no-op when disabled or when
  rich is not installed.
* ``RaiseOnSignal``: while active, SIGINT and SIGTERM raise ``Interrupted`` (a
  ``KeyboardInterrupt`` that knows its signal) at once, for loops that save after every
  measurement and need no step to finish (``relpos longctx``).
* ``exit_code(signum)``: the shell's convention for a command stopped by a signal,
  ``128 + signum`` (130 for Ctrl-C, 143 for SIGTERM).
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Sequence
from typing import Any, Self

__all__ = [
    "SignalStop",
    "RaiseOnSignal",
    "Interrupted",
    "Progress",
    "exit_code",
    "resume_command",
]


def resume_command(argv: Sequence[str] | None, command: str) -> str:
    """The command line that continues an interrupted run: ``relpos ARGV`` without
    ``--force`` (which would start afresh) and with ``--resume`` (once)."""
    args = [a for a in (argv or [command]) if a != "--force"]
    if "--resume" not in args:
        args.append("--resume")
    return "relpos " + shlex.join(args)


def exit_code(signum: int | None) -> int:
    """``128 + signum`` (SIGTERM: 143); 130 (SIGINT's) when no signal is known (Ctrl-C
    raised as ``KeyboardInterrupt`` outside ``SignalStop``)."""
    return 128 + (signal.SIGINT if signum is None else int(signum))


class Interrupted(KeyboardInterrupt):
    """Raised by ``RaiseOnSignal``'s handlers; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


class SignalHandlers:
    """Installs ``self._handle`` for SIGINT/SIGTERM while the context is open (main thread
    only); the previous handlers come back on exit. Subclasses define ``_handle``."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class RaiseOnSignal(SignalHandlers):
    """SIGINT/SIGTERM raise ``Interrupted(signum)``."""

    def _handle(self, signum: int, frame: Any) -> None:
        raise Interrupted(signum)


class SignalStop(SignalHandlers):
    """SIGINT/SIGTERM record the first signal (``signum``); a second one stops at once."""

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum


class Progress:
    """The rich progress bar (a no-op when disabled or rich is missing)."""

    def __init__(self, enabled: bool, description: str, total: int, completed: int) -> None:
        self.bar = None
        if not enabled:
            return
        try:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
        except ImportError:
            return
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            refresh_per_second=4,
        )
        self.task = self.bar.add_task(
            description, total=total, completed=completed, loss="-", tps="-"
        )

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def update(self, step: int, loss: float | None, tokens_per_second: float) -> None:
        if self.bar is not None:
            self.bar.update(
                self.task,
                completed=step,
                loss="-" if loss is None else f"{loss:.4f}",
                tps=f"{tokens_per_second:,.0f}",
            )

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()
