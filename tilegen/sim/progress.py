"""A long emulation's word to the user: never minutes without one.

Messages go through the "tilegen" logger at INFO where the program set up logging (its level
and handlers decide), else to stderr, unless that logger was turned down
(logging.getLogger("tilegen").setLevel(logging.WARNING))."""
from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager

AFTER_S = 5.0   # a run still going this long says so,
EVERY_S = 5.0   # and again this often

_log = logging.getLogger("tilegen")


def say(message: str) -> None:
    if _log.hasHandlers():
        _log.info(message)
    elif _log.level <= logging.INFO:
        print(f"tilegen: {message}", file=sys.stderr, flush=True)


@contextmanager
def ticking(status, after: float = None, every: float = None):
    """While the block runs: after `after` seconds (AFTER_S), and every `every` seconds (EVERY_S)
    from then, say(status(seconds so far))."""
    after = AFTER_S if after is None else after
    every = EVERY_S if every is None else every
    done = threading.Event()
    start = time.perf_counter()

    def tick():
        wait = after
        while not done.wait(wait):
            say(status(time.perf_counter() - start))
            wait = every

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join(1.0)   # (no word after the block: one being said now is finished first)


__all__ = ["say", "ticking"]
