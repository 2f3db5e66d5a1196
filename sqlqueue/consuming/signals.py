"""SIGINT and SIGTERM for a runner's process: the first stops it gracefully, a second one
exits at once. ``Runner.install_signal_handlers`` installs them."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sqlqueue.consumer")


class StopOnSignals:
    """Counts the signals received; the first calls ``stop``, a second exits at once."""

    def __init__(self, stop: Callable[[], None], shutdown_timeout: float) -> None:
        self.stop = stop
        self.shutdown_timeout = shutdown_timeout  # for the message only
        self.received = 0

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, frame: Any) -> None:
        self.received += 1
        if self.received > 1:
            logger.warning("Second signal: exiting at once.")
            os._exit(1)
        logger.warning("Signal %s: finishing in-flight handlers (up to %ss); signal "
                       "again to exit at once.", signum, self.shutdown_timeout)
        self.stop()
