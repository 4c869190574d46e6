"""A camera's clip ring: its last N frames taken at least T seconds apart, for a program's `clip:`
(docs/inspection.md). Capture offers every frame; the ring keeps one only when it is T after the
newest it holds, and never more than N (a deque with maxlen): memory is at most N frames, each at most
`max_bytes / N` (a larger frame is refused and counted, never queued). A frame more than the clip's
gap limit after the newest (the camera stalled, reconnected) empties the ring first: a clip is a short
sequence, never frames from both sides of a stall. The trigger loop asks for a clip when an inspection
is due and gets one only when the ring is full and holds a frame that no clip asked about yet.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from edge_runtime.config.programs import CLIP_RING_BYTES, ClipConfig, clip_gap_advice, clip_gap_need
from edge_runtime.core.batch import ClipFrame

STUCK_STREAK = 3  # frames in a row that each restarted the ring: a camera slower than the clip's gap limit


class ClipRing:
    """The last `frames` frames of one camera, each at least `spacing_s` after the one before it."""

    def __init__(self, clip: ClipConfig, max_bytes: int = CLIP_RING_BYTES) -> None:
        self.config = clip
        self.frames, self.spacing_s = clip.frames, clip.spacing_s
        self.frame_bytes = max_bytes // clip.frames  # each frame's share of the ring's bound
        self._ring: deque[ClipFrame] = deque(maxlen=clip.frames)
        self._lock = threading.Lock()
        self._asked = -1  # seq of the newest frame of the last clip handed out
        self.too_large = 0  # frames refused: more bytes than their share of the bound
        self.restarts = 0  # the ring emptied by a gap over the limit (a stall) or a clock stepped back
        self.streak = 0  # frames in a row that each emptied the ring: at STUCK_STREAK no clip can ever fill
        self._streak_gap = 0.0  # the shortest gap over the limit among the streak's first STUCK_STREAK (the advice)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)

    def offer(self, image: np.ndarray, seq: int, captured_at: float) -> bool:
        """Keep the frame when it is `spacing_s` after the newest kept (True). Called by capture for
        every frame: a comparison, no copy (capture hands over a new array per frame)."""
        if image.nbytes > self.frame_bytes:
            self.too_large += 1
            return False
        with self._lock:
            if self._ring:
                newest = self._ring[-1]
                if seq <= newest.seq:
                    return False
                gap = captured_at - newest.captured_at
                if gap < 0 or gap > self.config.gap_limit_s:
                    # The wall clock stepped back (the kept frames' times no longer compare), or the camera
                    # stalled: the clip starts again from this frame.
                    self._ring.clear()
                    self.restarts += 1
                    self.streak += 1
                    if self.streak == 1:
                        self._streak_gap = 0.0
                    if gap > 0 and self.streak <= STUCK_STREAK:  # fixed once stuck: the reason is a metrics label
                        self._streak_gap = min(self._streak_gap, gap) if self._streak_gap else gap
                elif gap < self.spacing_s:
                    return False
                else:
                    self.streak = 0
            self._ring.append(ClipFrame(image, seq, captured_at))
            return True

    def stuck(self) -> str | None:
        """Why no clip can fill (None: it can): the last STUCK_STREAK frames each came more than the gap
        limit after the one before (a camera slower than `max_gap_s`), so each started the clip again. The
        advice is what check_clip_pace would ask of a camera of known fps, at the shortest of those gaps."""
        if self.streak < STUCK_STREAK:
            return None
        # No count in the text: it is a metrics label (edge_runtime_degraded{reason}), one series while it lasts
        # (the advice comes from the streak's first STUCK_STREAK gaps, fixed until it ends).
        reason = (f"its clip never fills: its frames come more than max_gap_s ({self.config.gap_limit_s:g} s) "
                  "apart, each starting the clip again")
        if self._streak_gap <= 0:  # only a wall clock stepping back: no interval to advise from
            return reason
        # The rule the config checks a camera of known fps by (check_clip_pace), at the interval seen.
        need = clip_gap_need(self.config, self._streak_gap)[1]
        return f"{reason}; set the program's clip.max_gap_s to at least {clip_gap_advice(need):.1f}"

    def take(self) -> tuple[ClipFrame, ...] | None:
        """The clip, oldest first, when the ring holds `frames` frames and a new one since the last
        clip taken; else None."""
        with self._lock:
            if len(self._ring) < self.frames or self._ring[-1].seq == self._asked:
                return None
            self._asked = self._ring[-1].seq
            return tuple(self._ring)
