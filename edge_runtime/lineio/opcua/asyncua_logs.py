"""asyncua's own WARNING/ERROR lines, limited: those that repeat a refusal the door (guard.py) logs with
the peer's address are dropped, the others logged once, then at most once a minute with the count."""

from __future__ import annotations

import logging
import sys
import threading
import time

from edge_runtime.lineio.opcua.guard import LOG_INTERVAL_S

# asyncua's lines that repeat a refusal the door logs with the peer's address.
_REPEATS = frozenset({"Rejected active session UserIdentityToken not supported",
                      "Unauthenticated user attempted to connect"})


class _AsyncuaLogLimit(logging.Filter):
    """Each of asyncua's WARNING/ERROR messages once, then at most once a minute with the count."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], list[float]] = {}  # (logger, template) -> [next time, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if record.msg in _REPEATS:
            return False
        key, now = (record.name, str(record.msg)[:200]), time.monotonic()
        with self._lock:
            state = self._state.get(key)
            if state is not None and now < state[0]:
                state[1] += 1
                return False
            if len(self._state) >= 512:  # templates are finite; this only bounds a surprise
                self._state.clear()
            self._state[key] = [now + LOG_INTERVAL_S, 0]
        if state is not None and state[1]:
            record.msg = f"{record.msg} ({int(state[1])} more like this in the last {LOG_INTERVAL_S:.0f} s)"
        return True


_LIMIT = _AsyncuaLogLimit()


def tame_asyncua_logs() -> None:
    """Put the limit on every asyncua logger (a logger's filters see only its own records). Some are made
    only when first used (InternalSession's, in its constructor), so every imported asyncua module's
    logger is made here, and any other logger under asyncua that already exists gets it too."""
    logging.getLogger("asyncua").setLevel(logging.WARNING)  # it logs every call at INFO
    names = {name for name in list(sys.modules) if name == "asyncua" or name.startswith("asyncua.")}
    names |= {name for name in list(logging.Logger.manager.loggerDict) if name.startswith("asyncua.")}
    for name in names:
        logger = logging.getLogger(name)
        if _LIMIT not in logger.filters:
            logger.addFilter(_LIMIT)
