"""Progress of a long command on stderr: stage lines, a live indicator, warnings."""

import threading
import time
from typing import Any, Mapping, Optional, TextIO


# --------------------------------------------------------------------------------------
# Progress on stderr


# --------------------------------------------------------------------------------------
class Progress:
    """
    Progress messages on a stream (stderr).

    Stage summaries are whole lines prefixed by the elapsed time.  During the fit a terminal
    gets one line rewritten in place (elapsed time, and iteration / losses when the estimator
    reports them); any other stream (CI logs) gets a plain line at most every
    ``log_every_s`` seconds, so no control characters reach log files.

    :param stream: where to write.
    :param prog: command name prefixed to every line.
    :param quiet: write nothing.
    :param tty: force terminal behaviour (default: ``stream.isatty()``).
    :param log_every_s: interval of the plain progress lines, s.
    """

    def __init__(self, stream: TextIO, prog: str, quiet: bool = False,
                 tty: Optional[bool] = None, log_every_s: float = 30.0) -> None:
        self.stream = stream
        self.prog = prog
        self.quiet = quiet
        isatty = getattr(stream, 'isatty', None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self.log_every_s = log_every_s
        self.start = time.perf_counter()
        self._label = ''
        self._status = ''
        self._live_start = 0.0
        self._last_log = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._width = 0

    def _elapsed(self) -> str:
        return f'[{time.perf_counter() - self.start:7.1f} s]'

    def _clear(self) -> None:
        if self.tty and self._width:
            self.stream.write('\r' + ' ' * self._width + '\r')
            self._width = 0

    def stage(self, message: str) -> None:
        """
        Print a stage summary line.

        :param message: the line.
        """
        if self.quiet:
            return
        with self._lock:
            self._clear()
            self.stream.write(f'{self.prog}: {self._elapsed()} {message}\n')
            self.stream.flush()

    def warn(self, message: str) -> None:
        """
        Print a warning line (even when quiet).

        :param message: the warning.
        """
        with self._lock:
            self._clear()
            self.stream.write(f'{self.prog}: warning: {message}\n')
            self.stream.flush()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """
        Record the optimiser's state (estimator callback).

        Accepts ``(iteration, loss[, validation_loss])``, keywords of those names (``val_loss``
        and ``validation`` too) or one mapping of them.

        :param args: positional values or one mapping.
        :param kwargs: keyword values.
        """
        if len(args) == 1 and isinstance(args[0], Mapping):
            kwargs = {**args[0], **kwargs}
            args = ()
        names = ('iteration', 'loss', 'validation_loss')
        values = dict(zip(names, args))
        values.update(kwargs)
        validation = values.get('validation_loss', values.get('val_loss',
                                                              values.get('validation')))
        parts = []
        if values.get('iteration') is not None:
            parts.append(f'iteration {values["iteration"]}')
        if values.get('loss') is not None:
            parts.append(f'loss {float(values["loss"]):.4g}')
        if validation is not None:
            parts.append(f'val loss {float(validation):.4g}')
        with self._lock:
            self._status = ', '.join(parts)
        if not self.tty and not self.quiet:
            now = time.perf_counter()
            if now - self._last_log >= self.log_every_s:
                self._last_log = now
                self.stage(f'{self._label}: {self._status}')

    def _render(self) -> None:
        with self._lock:
            seconds = time.perf_counter() - self._live_start
            line = f'{self.prog}: {self._label} {seconds:6.1f} s'
            if self._status:
                line += f'  {self._status}'
            line = line[:119]
            pad = max(0, self._width - len(line))
            self.stream.write('\r' + line + ' ' * pad)
            self.stream.flush()
            self._width = len(line)

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.5 if self.tty else self.log_every_s):
            if self.tty:
                self._render()
            elif time.perf_counter() - self._last_log >= self.log_every_s:
                self._last_log = time.perf_counter()
                status = f': {self._status}' if self._status else ''
                self.stage(f'{self._label}: still running '
                           f'({time.perf_counter() - self._live_start:.0f} s){status}')

    def begin(self, label: str) -> None:
        """
        Start the live indicator of a long step.

        :param label: what runs (e.g. ``'fitting diffnea'``).
        """
        self._label, self._status = label, ''
        self._live_start = self._last_log = time.perf_counter()
        if self.quiet:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def end(self) -> None:
        """Stop the live indicator and clear its line."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            self._clear()
            self.stream.flush()
