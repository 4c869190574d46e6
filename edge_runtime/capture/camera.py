"""Camera capture through OpenCV: one thread per camera into a latest-frame slot.

Capture never waits for inference. Each camera reads as fast as its source delivers, keeps only the
newest frame, and counts every frame that was replaced before anyone took it. A source that fails
or ends is reopened with exponential backoff; its state and last error are visible to the daemon.
The sources themselves (and the checks on image files) are in sources.py.

A capture thread can be stuck inside OpenCV (a V4L2 or network read that does not return until the
driver or FFmpeg's read timeout gives up), and Python cannot interrupt it. `Camera.stop()` then leaves
the camera `stopping`, not stopped: its thread closes the capture itself once the read returns, the
daemon's health names it meanwhile (`stopping_cameras()`), and a new camera on the same source waits
for it before opening the source (one owner per device).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from edge_runtime.capture.sources import RefusedFiles, Source, crop, redact, source_kind
from edge_runtime.config import CameraConfig, ImageLimits

log = logging.getLogger(__name__)


class CameraState(str, Enum):
    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    FAILED = "failed"
    ENDED = "ended"  # a file source without looping has delivered everything
    STOPPING = "stopping"  # stop() timed out: the thread is still blocked in a read and holds the source
    STOPPED = "stopped"


@dataclass
class Frame:
    image: np.ndarray  # BGR, after the region of interest
    seq: int
    captured_at: float  # time.time() of the read
    capture_ms: float


@dataclass
class CameraStats:
    captured: int = 0
    dropped: int = 0  # replaced in the slot before it was taken for inspection
    read_errors: int = 0
    reconnects: int = 0  # reopened after a failure (a file starting over is a loop, not a reconnect)
    loops: int = 0  # a looping file or folder started over
    refused: int = 0  # image files refused by the decoder's checks (bomb, truncated, corrupt, ...)


class LatestFrame:
    """A one-frame slot: the newest frame wins; an overwritten, never-taken frame is a drop."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self._taken = True
        self.dropped = 0
        self.listener: Callable[[Frame], object] | None = None  # e.g. a clip ring (clip.py) sees every frame

    def put(self, frame: Frame) -> None:
        with self._cond:
            if not self._taken:
                self.dropped += 1
            self._frame, self._taken = frame, False
            self._cond.notify_all()
        listener = self.listener
        if listener is not None:
            listener(frame)

    def take(self, newer_than: int, timeout: float) -> Frame | None:
        """Wait up to `timeout` for a frame with seq > newer_than and mark it taken."""
        with self._cond:
            self._cond.wait_for(lambda: self._frame is not None and self._frame.seq > newer_than, timeout)
            if self._frame is None or self._frame.seq <= newer_than:
                return None
            self._taken = True
            return self._frame

    def peek(self) -> Frame | None:
        with self._cond:
            return self._frame


# ---- cameras whose thread outlived stop() -------------------------------------------------

STOP_TIMED_OUT = "stop timed out: the capture thread is still blocked reading the source"
_lingering_lock = threading.Lock()
_lingering: list[Camera] = []  # stop() requested, thread not ended yet: they still hold their source


def stopping_cameras() -> list[str]:
    """One health reason per camera whose stop timed out and whose thread still holds its source."""
    with _lingering_lock:
        cams = [c for c in _lingering if c.state == CameraState.STOPPING]
    return [f"camera {c.name}: stopping: its capture thread is still blocked reading {redact(str(c.cfg.source))}"
            for c in cams]


def _previous_owner(cam: Camera) -> Camera | None:
    """A stopped camera whose thread still holds `cam`'s source (the same source string)."""
    with _lingering_lock:
        return next((c for c in _lingering if c is not cam and str(c.cfg.source) == str(cam.cfg.source)), None)


# ---- the camera thread ---------------------------------------------------------------------

@dataclass
class CameraStatus:
    name: str
    kind: str
    source: str
    state: str
    last_error: str | None
    fps: float
    stats: dict[str, int] = field(default_factory=dict)


class Camera:
    """Reads one source forever into `slot`, reopening it with backoff when it fails."""

    def __init__(self, cfg: CameraConfig, limits: ImageLimits | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.kind = source_kind(cfg)
        self.limits = limits or ImageLimits()
        self.refused = RefusedFiles()
        self.slot = LatestFrame()
        self.stats = CameraStats()
        self.state = CameraState.CONNECTING
        self.last_error: str | None = None
        self._seq = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # state changes by stop() against the thread's last word
        self._finished = False  # the thread has released its source and ended
        self.released = threading.Event()  # set with _finished
        self.stop_requested: float | None = None  # time.monotonic() of stop()
        self._recent: list[float] = []  # capture times of the last ~2 s, for the fps figure
        self._thread = threading.Thread(target=self._run, name=f"camera-{cfg.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> bool:
        """Ask the thread to end and wait up to `timeout`. True when it ended; False when it is still
        blocked in a read: the camera stays `stopping` until the read returns and the thread closes the
        capture (it is a daemon thread, so it never holds the process's exit). Many cameras stop together
        with `request_stop()` on each, then `wait_stopped()` against one deadline (capture/rig.py)."""
        self.request_stop()
        return self.wait_stopped(timeout)

    def request_stop(self) -> None:
        """Ask the thread to end, without waiting for it (`wait_stopped` does)."""
        with self._lock:
            if self.stop_requested is None:
                self.stop_requested = time.monotonic()
            self._stop.set()
            if not self._thread.is_alive() and self._thread.ident is None:  # never started
                self._finished = True
                self.released.set()
                self.state = CameraState.STOPPED
                return
            if not self._finished:
                with _lingering_lock:
                    if self not in _lingering:
                        _lingering.append(self)

    def wait_stopped(self, timeout: float) -> bool:
        """After `request_stop()`: wait up to `timeout` for the thread to end; False (the camera left
        `stopping`) when it is still blocked in a read."""
        self.released.wait(max(0.0, timeout))
        with self._lock:
            if self._finished:
                self.state = CameraState.STOPPED
                return True
            self.state = CameraState.STOPPING
            self.last_error = STOP_TIMED_OUT
        log.warning("camera %s: stopping: its capture thread is still blocked reading %s; it closes the "
                    "source when the read returns", self.name, redact(str(self.cfg.source)))
        return False

    def status(self) -> CameraStatus:
        now = time.time()
        recent = [t for t in self._recent if now - t < 2.0]
        stats = {"captured": self.stats.captured, "dropped": self.slot.dropped,
                 "read_errors": self.stats.read_errors, "reconnects": self.stats.reconnects,
                 "loops": self.stats.loops, "refused": self.stats.refused}
        return CameraStatus(self.name, self.kind, redact(str(self.cfg.source)), self.state.value,
                            self.last_error, round(len(recent) / 2.0, 2), stats)

    def _set_state(self, state: CameraState, error: str | None = None) -> None:
        if self._stop.is_set():
            return  # stop() owns the state from now on
        if state != self.state or error != self.last_error:
            level = logging.WARNING if state in (CameraState.FAILED, CameraState.RECONNECTING) else logging.INFO
            log.log(level, "camera %s: %s%s", self.name, state.value, f" ({error})" if error else "")
        self.state = state
        if error is not None:
            self.last_error = error

    def _run(self) -> None:
        try:
            if self._wait_for_previous_owner():
                self._capture()
        finally:  # the source is closed by now (by this thread: one owner of the native capture)
            with self._lock, _lingering_lock:
                lingered = self.state == CameraState.STOPPING
                if self in _lingering:
                    _lingering.remove(self)
                self._finished = True
                if self._stop.is_set():
                    self.state = CameraState.STOPPED
                if lingered and self.last_error == STOP_TIMED_OUT:
                    self.last_error = None
                self.released.set()
            if lingered:
                log.info("camera %s: stopped (the blocked read returned; the source is closed)", self.name)

    def _wait_for_previous_owner(self) -> bool:
        """Wait (stoppably) until no earlier camera's thread holds this source. False: stopped meanwhile."""
        while (previous := _previous_owner(self)) is not None:
            self._set_state(CameraState.CONNECTING, f"waiting for camera {previous.name}'s previous capture thread "
                                                    f"to release {redact(str(self.cfg.source))}")
            while not previous.released.wait(0.1):
                if self._stop.is_set():
                    return False
        return not self._stop.is_set()

    def _capture(self) -> None:
        backoff, failures, looping = self.cfg.reconnect_min_s, 0, False
        while not self._stop.is_set():
            try:
                source = Source(self.cfg, self.limits, self.refused)
            except Exception as exc:  # noqa: BLE001 - any failure to open is reported, never fatal
                failures += 1
                looping = False
                self._set_state(CameraState.FAILED if failures >= 3 else CameraState.RECONNECTING, str(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.cfg.reconnect_max_s)
                continue
            if looping:
                self.stats.loops += 1
            elif failures or self.stats.captured:
                self.stats.reconnects += 1
            looping = False
            self._set_state(CameraState.STREAMING)
            before = self.stats.captured
            try:
                ended = self._stream(source)
            finally:
                source.close()
            if self.stats.captured > before:
                backoff, failures = self.cfg.reconnect_min_s, 0
            if self._stop.is_set():
                break
            if ended and source.is_file:
                if not self.cfg.loop:
                    self._set_state(CameraState.ENDED)
                    return
                backoff, failures, looping = self.cfg.reconnect_min_s, 0, True  # a file loops at once
                continue
            failures += 1
            why = "the source stopped delivering frames"
            if source.is_file and source.refused_count:
                why = (f"no usable image at {source.path}: {source.refused_count} file(s) refused "
                       f"(last: {source.last_refusal})")
            self._set_state(CameraState.RECONNECTING, why)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.cfg.reconnect_max_s)

    def _report_refusals(self, source: Source) -> None:
        for path, reason in source.new_refusals:
            self.stats.refused += 1
            self.last_error = f"refused {path.name}: {reason}"
            log.warning("camera %s: refused %s", self.name, reason)  # once per file and version of it
        source.new_refusals.clear()

    def _stream(self, source: Source) -> bool:
        """Read until the source ends or fails; True when it simply ran out (end of file)."""
        delivered = 0
        next_due = time.monotonic()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                image = source.read()
            except Exception as exc:  # noqa: BLE001 - a broken decoder must not kill the thread
                self.stats.read_errors += 1
                self.last_error = f"read failed: {exc}"
                image = None
            if image is not None and delivered == 0:
                self.last_error = None  # delivering again after a (re)open: the last problem is over
            self._report_refusals(source)
            if image is None:
                if not source.is_file:
                    self.stats.read_errors += 1
                return source.is_file and delivered > 0
            delivered += 1
            self._seq += 1
            self.stats.captured += 1
            now = time.time()
            self._recent = [t for t in self._recent if now - t < 2.0] + [now]
            self.slot.put(Frame(crop(image, self.cfg.roi), self._seq, now, (time.perf_counter() - t0) * 1000))
            if source.pace_s:
                next_due += source.pace_s
                self._stop.wait(max(0.0, next_due - time.monotonic()))
        return False
