"""Stopping an invocation without losing a round: the first SIGINT or SIGTERM asks
every running run to stop at its next round boundary, where it writes its rows and a checkpoint
of the last completed round; runs not started yet stay unstarted (``--resume`` starts them). A
second signal stops at once (``KeyboardInterrupt``), still losing nothing already written."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequest:
    """Whether this invocation was asked to stop (set by :meth:`handling_signals`' handler, or
    by :meth:`request` in tests)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_number: int | None = None
        """The signal that asked for the stop (None: none, or :meth:`request`)."""

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()
        self.signal_number = None

    @property
    def exit_code(self) -> int:
        """The shell's code for a process stopped by the signal that asked for the stop:
        130 after SIGINT (Ctrl-C), 143 after SIGTERM (a scheduler, ``timeout``, ``docker
        stop``)."""
        return 128 + (self.signal_number or signal.SIGINT)

    def terminate_as_interrupt(self) -> None:
        """SIGTERM (a scheduler, ``timeout``, ``docker stop``) raises KeyboardInterrupt, so that
        a command stops as Ctrl-C stops it, with its closing message and exit code 143, instead
        of being killed mid-write; while runs go, :meth:`handling_signals` stops them at a round
        boundary instead. Called when a command starts and again once Ray is up (``ray.init``
        installs a SIGTERM handler of its own that exits at once). Only in the main thread
        (tests call commands from others)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum: int, frame: FrameType | None) -> None:
            self.signal_number = signum
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, interrupt)

    @contextmanager
    def handling_signals(self) -> Iterator[None]:
        """While inside: the first SIGINT/SIGTERM requests a stop (with a line on stderr), the
        next raises KeyboardInterrupt; after a signal, leaving ignores both signals for the
        rest of the process (it only exits from there). Only in the main thread (elsewhere:
        nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.clear()

        signalled = False

        def handler(signum: int, frame: FrameType | None) -> None:
            nonlocal signalled
            signalled = True
            if self.requested:
                raise KeyboardInterrupt
            self.signal_number = signum
            self.request()
            print(f"\n{signal.Signals(signum).name}: stopping at the next round boundary: every "
                  "running run finishes its round in flight, writes its rows and a checkpoint; "
                  "press Ctrl-C again to stop at once (rows already written are kept).",
                  file=sys.stderr, flush=True)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, old in previous.items():
                # once a stop was asked for, the invocation is on its way out with everything
                # written: a late second signal must not turn its exit into a traceback
                signal.signal(number, signal.SIG_IGN if signalled else old)


STOP = StopRequest()
"""The invocation's stop request."""
