"""A progress bar for the benchmark suite: tqdm when it is installed, else a
small one of our own. Either draws on stderr, and only when stderr is a
terminal, so logs and pipes get clean lines; messages go to stdout through
:meth:`Progress.write` so they never tear the bar."""

from __future__ import annotations

import sys
from typing import IO, Any


class Progress:
    """``Progress(total, desc)``; ``advance(n)``, ``add_total(n)``,
    ``describe(text)``, ``write(msg)``, ``close()``.

    Args:
      total: the number of steps known now (more may be added).
      desc: the label drawn left of the bar.
      enabled: False draws nothing (``--no-progress``); None (default) draws
        only when ``stream`` is a terminal.
      stream: where the bar is drawn (default ``sys.stderr``).
      use_tqdm: False forces the built-in bar even when tqdm is installed.
    """

    def __init__(self, total: int, desc: str = "", *, enabled: bool | None = None,
                 stream: IO[str] | None = None, use_tqdm: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = total
        self.done = 0
        self.desc = desc
        self._tqdm: Any = None
        self._drawn = False
        if enabled and use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._tqdm = tqdm(total=total, desc=desc, file=self.stream,
                                  leave=False, dynamic_ncols=True)

    # -- the built-in bar --------------------------------------------------
    def _line(self) -> str:
        width = 30
        frac = self.done / self.total if self.total else 1.0
        frac = min(max(frac, 0.0), 1.0)
        fill = int(round(frac * width))
        return (f"{self.desc} [{'#' * fill}{'.' * (width - fill)}] "
                f"{self.done}/{self.total} ({frac:.0%})")

    def _draw(self) -> None:
        self.stream.write("\r\x1b[K" + self._line())
        self.stream.flush()
        self._drawn = True

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    # -- API -----------------------------------------------------------------
    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self.enabled:
            self._draw()

    def add_total(self, n: int) -> None:
        self.total += n
        if self._tqdm is not None:
            self._tqdm.total = self.total
            self._tqdm.refresh()
        elif self.enabled:
            self._draw()

    def describe(self, desc: str) -> None:
        self.desc = desc
        if self._tqdm is not None:
            self._tqdm.set_description(desc)
        elif self.enabled:
            self._draw()

    def write(self, msg: str) -> None:
        """Prints a line to stdout without tearing the bar."""
        if self._tqdm is not None:
            self._tqdm.clear()
            print(msg, flush=True)
            self._tqdm.refresh()
            return
        if self.enabled:
            self._erase()
        print(msg, flush=True)
        if self.enabled:
            self._draw()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        elif self.enabled:
            self._erase()
        self.enabled = False
