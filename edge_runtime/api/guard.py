"""Connection guard: waitress's public server and channel classes, subclassed against slowloris.

waitress closes a connection only after `channel_timeout` seconds *without a byte*, so a client that
dribbles one header byte every few seconds keeps a connection forever; a few hundred of them fill the
connection table and `/healthz` can no longer connect. These bounds close that hole:

- a request deadline: a request's head and body must arrive within `api.request_deadline_s` of its
  first byte, or the connection gets a 408 and is closed, whatever it keeps sending;
- a per-client cap: one address holds at most `api.connections_per_client` connections; beyond it a
  new connection is refused at accept time (a 429 line, then closed);
- headroom for the device itself: clients other than 127.0.0.1 / ::1 get `CONNECTION_LIMIT` slots,
  and waitress's own limit is `LOOPBACK_RESERVE` higher, so network clients cannot keep a local
  health check out. 127.0.0.1 and ::1 are exempt from the cap (not from the deadline): Docker's
  HEALTHCHECK and the device's own tools use them. Other 127.x addresses count as ordinary clients.
- a budget for request bodies being received: each is reserved at its head, before waitress spools
  it to a temporary file, so many uploads (with or without a token) cannot fill the disk.
- a send deadline: a connection that owes a response (part of it buffered) and takes no byte of it
  for `Limits.send_stall_s` is closed. waitress buffers at most 16 MB of a response, then the thread
  writing it waits for the client: without the deadline a client that asked for a large export and
  never read held a server thread for as long as it kept the connection open (the write fails then
  and the thread goes back to the pool). What the client takes is what it acknowledged (bytes handed
  to the kernel less what the kernel still holds, TIOCOUTQ): the kernel takes a few MB at once, then
  nothing until about a third of it has gone, so a client reading 64 KiB/s steadily gave the server no
  successful send for over 30 s at a time and was closed as stalled.
- a transfer bound for a response that asks for one (result exports, `SendBound`): a client must take
  at least `min_bytes_s` over every `window_s` in which it was owed bytes, and the whole answer within
  `max_s`, or the connection is closed. The stall deadline alone let a client that read a little every
  few seconds keep the one export slot for ever.
- a refusal the client can read: a request refused before its body was read (the 503 of the budget,
  a 408, waitress's own 413 / 431 / 400) is answered, the connection's sending side is shut down, and
  what the client still sends is read and thrown away (lingering close, as nginx does) for at most
  `Limits.linger_s` and the largest body the server takes, then the socket is closed. Closing it at
  once with the body unread made the kernel send a reset that discarded the answer: the client saw
  ECONNRESET / EPIPE instead of "busy, retry later". The drain runs in the server's loop thread
  (no worker thread waits), keeps nothing (one reused buffer) and the connection still counts
  against its client's cap while it lingers.
- health probes answered in the loop: `GET`/`HEAD` of `/healthz` and `/readyz` are answered by the
  thread that hands a request to the pool (the loop thread for a connection's first request), from
  answers the app's own routes made ahead (`ProbeAnswers`: a thread of its own makes them again every
  `PROBE_REFRESH_S`), so a probe waits for no server thread and runs no WSGI stack. With thirty
  CPU-bound clients reading status and metrics, each hop from thread to thread waits for the
  interpreter lock behind them: a probe served by a thread of its own still took 0.05-0.15 s (p95)
  on a 2-core device. A `/readyz` answer older than `PROBE_MAX_AGE_S` (its thread starved or stuck)
  is not used: the probe goes to the lane below, which asks the app there and then.
- a lane for health: a probe not answered in the loop runs on a server thread of its own
  (`HEALTH_THREADS`), which no other request ever takes, so it never queues behind status and metrics
  (through the same app: same answers, same auth); a connection's next request is routed again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import socket
import struct
import termios
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from waitress.adjustments import Adjustments
from waitress.channel import ClientDisconnected, HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, Task, ThreadedTaskDispatcher, WSGITask

from edge_runtime.config.api import EXPORT_MAX_S, EXPORT_MIN_KIB_S

log = logging.getLogger(__name__)

CONNECTION_LIMIT = 500  # connections for clients other than the device's own loopback
LOOPBACK_RESERVE = 50  # slots above it that only 127.0.0.1 / ::1 may take
EXEMPT = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
SEND_STALL_S = 30.0  # see Limits.send_stall_s
CHANNEL_KEY = "edge_runtime.channel"  # the WSGI environ key of the request's GuardedChannel (SendBound)
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})  # served on the health lane (see the module)
HEALTH_METHODS = frozenset({"GET", "HEAD"})
HEALTH_THREADS = 1  # the lane's server threads, beyond those waitress is told of
PROBE_REFRESH_S = 0.1  # how often ProbeAnswers asks the app again: /readyz is usually this late at most
PROBE_MAX_AGE_S = 1.0  # a /readyz answer older than this is not served from the loop (the lane asks the app)
REFUSAL = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nConnection: close\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s")


def _json_response(status: str, error: str, message: str) -> bytes:
    body = json.dumps({"error": {"type": error, "message": message}}).encode()
    return (f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class Limits:
    """Read on every accept and maintenance pass, so a reload changes them live."""

    request_deadline_s: float = 15.0
    connections_per_client: int = 64
    bodies_bytes: int = 64 * 2**20  # request bodies being received at once (waitress spools them to disk)
    linger_s: float = 5.0  # how long a refused connection's unread body is drained before it is closed
    send_stall_s: float = SEND_STALL_S  # a connection owing a response that takes no byte of it this long is closed
    # Result exports (SendBound): the least a client must take per window while owed bytes, and the most
    # an export may take in all (api.export_min_kib_s, api.export_max_s).
    export_min_bytes_s: float = EXPORT_MIN_KIB_S * 1024
    export_window_s: float = 60.0
    export_max_s: float = EXPORT_MAX_S


@dataclass
class SendBound:
    """A transfer bound on one response (set by the app through `bind`, checked by the loop thread).

    Time in which the client owed nothing (it had taken every byte the app had written: the app is the
    slow side then) starts a new window; a slow link that keeps to the rate finishes however large the
    answer is, up to `max_s`."""

    what: str
    min_bytes_s: float
    window_s: float
    max_s: float
    started: float = 0.0
    window_start: float = 0.0
    window_sent: int = 0
    done: bool = False  # the app has written the whole answer (what is left is in waitress's buffer)
    # The channel's bytes_sent once the answer's last byte has left waitress's buffer (set by ChannelTask
    # when its task is over: answers pipelined after it queue behind that byte).
    end_mark: int | None = None
    # Called once when the bound ends: the answer handed on whole (its last byte out of waitress's buffer),
    # cut, the connection closed, or a later answer on the connection bound (GuardedChannel.end_bound).
    on_end: Callable[[], None] | None = None
    ended: bool = False

    def sent(self, channel: GuardedChannel) -> bool:
        """Whether the answer has left waitress's buffer whole (read under or after its end_mark is set)."""
        if self.end_mark is not None:
            return channel.bytes_sent >= self.end_mark
        return self.done and not channel.total_outbufs_len

    def end(self) -> None:
        if not self.ended:  # the channel's bound lock makes this once
            self.ended = True
            if self.on_end is not None:
                self.on_end()

    def breached(self, channel: GuardedChannel, mono: float) -> str | None:
        """Why the connection is to be cut now, or None."""
        if mono - self.started > self.max_s:
            return f"was not taken whole within {self.max_s:.0f} s"
        if not channel.total_outbufs_len or channel.drained >= self.window_start:
            self.window_start, self.window_sent = mono, channel.taken  # the client kept up
            return None
        took = channel.taken - self.window_sent
        if mono - self.window_start < self.window_s:
            return None
        if took < self.min_bytes_s * (mono - self.window_start):
            return f"took {took} bytes in {mono - self.window_start:.0f} s, less than " \
                   f"{self.min_bytes_s / 1024:g} KiB/s"
        self.window_start, self.window_sent = mono, channel.taken
        return None


def bind(environ: dict[str, Any], what: str, limits: Limits,
         on_end: Callable[[], None] | None = None) -> SendBound | None:
    """Put the response of this request under `limits`' export bound; None when not served by
    GuardedServer (a test client), and `on_end` is the caller's then. Set `done` on it when the app has
    written its last byte; `on_end` runs once when the bound ends (see SendBound.on_end)."""
    channel = environ.get(CHANNEL_KEY)
    if not isinstance(channel, GuardedChannel):
        return None
    mono = time.monotonic()
    bound = SendBound(what, limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s, mono, mono,
                      channel.bytes_sent - unacked(channel.socket), on_end=on_end)
    channel.end_bound()  # a bound left by an earlier answer on this connection is over
    channel.bound = bound
    return bound


def unacked(sock: socket.socket) -> int:
    """Bytes the kernel still holds for the peer (not sent, or not acknowledged); 0 where unknown."""
    try:
        held: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError, AttributeError):  # closed, or not Linux
        return 0
    return held


class ChannelTask(WSGITask):
    """waitress's WSGI task, with its channel in the environ (CHANNEL_KEY) for `bind`. When the task is
    over, a bound its answer made ends once the answer's last byte has left waitress's buffer (its
    end_mark), not when the connection's next request begins: up to 16 MB of it can still be there, and
    a request pipelined behind it exempted that rest from the bound's rate and clock and gave its slot
    back. Nor does the bound judge the next answer past that byte (it did until the maintenance pass
    cleared it, up to a second later)."""

    def service(self) -> None:
        channel = self.channel
        try:
            super().service()
        finally:
            if not channel.connected:  # closed under the task: nothing more will be sent
                channel.end_bound()
            bound = channel.bound
            if bound is not None and bound.end_mark is None:
                with channel.outbuf_lock:  # bytes_sent and the buffer move together under it
                    bound.end_mark = channel.bytes_sent + channel.total_outbufs_len
                if bound.sent(channel):
                    channel.end_bound(bound)

    def get_environment(self) -> Any:
        environ = super().get_environment()
        environ[CHANNEL_KEY] = self.channel
        return environ


class JsonErrorTask(ErrorTask):
    """waitress's own error answers (a body past its bound, a malformed head, a chunked body gone
    wrong) in the API's JSON error shape, not text/plain: clients parse one error format."""

    def execute(self) -> None:
        e = self.request.error
        message = str(e.body).strip() or e.reason
        body = json.dumps({"error": {"message": message, "type": e.reason.lower().replace(" ", "_"),
                                     "code": e.code}}).encode()
        self.status = f"{e.code} {e.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.channel.refused = True  # its body may be unread: the channel drains it before closing
        self.content_length = len(body)
        self.write(body)


@dataclass(frozen=True)
class ProbeAnswer:
    status: str  # as the app gave it, e.g. "503 SERVICE UNAVAILABLE"
    headers: list[tuple[str, str]]  # the app's (Content-Type, Content-Length, Retry-After)
    body: bytes
    made: float  # monotonic: when the app was asked (the state it shows is that old)


class ProbeFailed(Exception):
    """Raised by a ProbeAnswers `make` whose answer to `path` is the app's error handler's (a hook or the
    route raised, the `__cause__`): `answer` is served all the same, as the app would answer a client."""

    def __init__(self, path: str, answer: tuple[str, list[tuple[str, str]], bytes]) -> None:
        super().__init__(f"GET {path} failed")
        self.path, self.answer = path, answer


class ProbeAnswers:
    """The health probes' answers, made ahead by the app's own routes on a thread of their own
    ("http-probes", every `refresh_s`) and served by the server's loop thread (see the module).

    `make(path)` is what the app answers a GET of `path`: (status, headers, body), or ProbeFailed with
    it where the app answered with its error handler (logged once per failure streak). `/healthz` always
    says the same; a `/readyz` answer older than `max_age_s` is not served, so readiness from the loop
    is at most that stale (usually `refresh_s`), and never a stuck thread's last word."""

    def __init__(self, make: Callable[[str], tuple[str, list[tuple[str, str]], bytes]],
                 refresh_s: float = PROBE_REFRESH_S, max_age_s: float = PROBE_MAX_AGE_S) -> None:
        self.make = make
        self.refresh_s, self.max_age_s = refresh_s, max_age_s
        self._answers: dict[str, ProbeAnswer] = {}  # replaced whole, read by the loop thread without a lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def get(self, path: str) -> ProbeAnswer | None:
        answer = self._answers.get(path)
        if answer is None or (path != "/healthz" and time.monotonic() - answer.made > self.max_age_s):
            return None
        return answer

    def refresh(self) -> ProbeFailed | None:
        """Make every path's answer again; return the first ProbeFailed (its answer is served all the same)."""
        failed = None
        for path in sorted(HEALTH_PATHS):
            made = time.monotonic()
            try:
                status, headers, body = self.make(path)
            except ProbeFailed as exc:
                (status, headers, body), failed = exc.answer, failed or exc
            self._answers = {**self._answers, path: ProbeAnswer(status, headers, body, made)}
        return failed

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="http-probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._answers = {}

    def _run(self) -> None:
        # Logged once per failure streak and once when it ends: a failing route fails every 0.1 s here,
        # whether or not anyone probes (before, the app's error handler logged a traceback each time).
        while True:
            failed: BaseException | None
            try:
                failed = self.refresh()
            except Exception as exc:  # noqa: BLE001 - no answer made: the app answers each probe on the lane
                failed = exc
            if failed is not None and not self._failing:
                if isinstance(failed, ProbeFailed):
                    log.error("api: GET %s failed (its answer is the app's error; logged once until the health "
                              "probes' answers are made without error again)", failed.path, exc_info=failed.__cause__)
                else:
                    log.error("api: the health probes' answers cannot be made; the app answers each probe",
                              exc_info=failed)
            elif failed is None and self._failing:
                log.warning("api: the health probes' answers are made without error again")
            self._failing = failed is not None
            if self._stop.wait(self.refresh_s):
                return


class ProbeTask(Task):
    """A health probe answered from a ProbeAnswer, with waitress's own response head (Date, Server,
    Connection; a HEAD gets the head only, Content-Length included, as from the app)."""

    def __init__(self, channel: Any, request: Any, answer: ProbeAnswer) -> None:
        super().__init__(channel, request)
        self.answer = answer

    def execute(self) -> None:
        self.complete = True  # what start_response marks: the head may be written
        self.status = self.answer.status
        self.response_headers.extend(self.answer.headers)
        self.content_length = len(self.answer.body)
        self.write(b"" if self.request.command == "HEAD" else self.answer.body)


class GuardedChannel(HTTPChannel):
    """An HTTP connection that remembers when the request it is receiving began."""

    task_class = ChannelTask
    error_task_class = JsonErrorTask

    requests: list[Any]  # waitress's: the complete requests not yet answered, the head one being served
    request_started: float | None = None
    client: str = ""
    _body_for: Any = None  # the request whose body is counted against the server's budget
    _body_bytes = 0
    refused = False  # answered before its request was read whole: drain what still comes before closing
    _linger_until: float | None = None  # while draining: when the socket is closed however much still comes
    _linger_left = 0  # bytes the drain still takes before the socket is closed
    last_sent = 0.0  # monotonic: when the client last took a byte, or last owed nothing (loop thread)
    bytes_sent = 0  # bytes of answers handed to the kernel
    taken = 0  # of those, what the client has acknowledged (note_progress, loop thread)
    drained = 0.0  # monotonic: when the client last took the last byte it was owed
    bound: SendBound | None = None  # the transfer bound of the response being sent (bind)

    def received(self, data: bytes) -> bool:
        done: bool = super().received(data)
        # A partial request is pending: its deadline runs from the first chunk that began it.
        if self.request is None:
            self.request_started = None
        elif self.request_started is None:
            self.request_started = time.monotonic()
        self._count_body()
        return done

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_sent = time.monotonic()
        self._bound_lock = threading.Lock()

    def _flush_some(self, do_close: bool = True) -> bool:
        sent: bool = super()._flush_some(do_close)
        if sent:
            self.last_sent = time.monotonic()
            if not self.total_outbufs_len:
                self.drained = self.last_sent
        bound = self.bound
        if bound is not None and bound.sent(self):
            self.end_bound(bound)  # handed on whole: the next answer on this connection is not the export's
        return sent

    def end_bound(self, only: SendBound | None = None) -> None:
        """End the channel's bound (`only`: if it is still that one), from any thread, once."""
        with self._bound_lock:
            bound = self.bound
            if bound is None or (only is not None and bound is not only):
                return
            self.bound = None
            bound.end()

    def note_progress(self, mono: float) -> None:
        """What the client has taken since the last pass: a byte acknowledged counts as a byte taken
        (the kernel's send buffer accepts nothing for tens of seconds at a slow client's pace). It is
        activity for waitress's idle timeout too, which closed a response whose app had finished (the
        rest still buffered) after 10 s without a successful send: a 64 KiB/s export ended at 10 MB."""
        taken = self.bytes_sent - unacked(self.socket)
        if taken > self.taken:
            self.taken = taken
            self.last_sent = mono
            self.last_activity = time.time()

    def send(self, data: bytes, do_close: bool = True) -> int:
        n: int = super().send(data, do_close=do_close)
        self.bytes_sent += n
        return n

    def _count_body(self) -> None:
        """Reserve a request's declared body size (a chunked body: the most it may be) as soon as its
        head is in, before waitress spools the body to a temporary file: past the budget the request
        is refused with a 503, so many slow uploads cannot fill the disk, with or without a token."""
        request = self.request
        if self._body_for is not None and self._body_for is not request:  # that body is complete
            self._release_body()
        if request is None or self._body_for is not None or not request.headers_finished or request.completed:
            return
        size = self.adj.max_request_body_size if request.chunked else request.content_length
        if size <= 0:
            return
        if not self.server.reserve_body(size):
            self.refuse_body()
            return
        self._body_for, self._body_bytes = request, size

    def _release_body(self) -> None:
        self.server.release_body(self._body_bytes)
        self._body_for, self._body_bytes = None, 0

    def refuse_body(self) -> None:
        """503 and close: too many request bodies are arriving at once."""
        self.server.bodies_refused += 1
        self._answer(_json_response("503 Service Unavailable", "busy",
                                    "too many uploads in progress on this device; retry shortly"))

    def cut(self) -> None:
        """Answer 408 and close (from the loop thread; no task owns this channel's output)."""
        self._answer(_json_response("408 Request Timeout", "request_timeout",
                                    "the request was not received in time; send it whole and promptly"))

    def _answer(self, payload: bytes) -> None:
        with self.outbuf_lock:
            self.outbufs[-1].append(payload)
            self.total_outbufs_len += len(payload)
        self.request = None
        self.request_started = None
        self.close_when_flushed = True
        self.refused = True
        if self._body_for is not None:
            self._release_body()

    @property
    def lingering(self) -> bool:
        return self._linger_until is not None

    def handle_close(self) -> None:
        """Close; but a refusal whose request may still be arriving is flushed, then the sending side is
        shut down (FIN after the answer) and incoming bytes are drained within bounds (see the module)."""
        if self.refused and self._linger_until is None and self.connected and not self.total_outbufs_len:
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError:  # the peer is gone already: close it now
                pass
            else:
                self._linger_until = time.monotonic() + self.server.limits.linger_s
                self._linger_left = self.adj.max_request_body_size
                self.will_close = self.close_when_flushed = False
                self.request = None
                self.request_started = None
                return
        super().handle_close()
        self.end_bound()

    def readable(self) -> bool:
        return True if self.lingering else bool(super().readable())

    def writable(self) -> bool:
        # While draining nothing is written; waitress's idle timeout may still ask to close (will_close).
        return self.will_close if self.lingering else bool(super().writable())

    def handle_read(self) -> None:
        if self._linger_until is None:
            super().handle_read()
            return
        try:
            n = self.socket.recv_into(self.server.drain_buffer)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        self._linger_left -= n
        if n == 0 or self._linger_left <= 0 or time.monotonic() >= self._linger_until:
            self.handle_close()  # EOF: the client read the answer; else past a bound (a reset, by its fault)

    def answer_probe(self, answer: ProbeAnswer) -> bool:
        """Serve the health probe at the head of `requests` from `answer`, in this thread, as waitress's
        service() would (its caller holds requests_lock); False when the connection closes after it.
        A bound of the answer before it on this connection ends when that answer's last byte is sent, not
        here (ChannelTask.service)."""
        request = self.requests[0]
        task = ProbeTask(self, request, answer)
        try:
            task.service()
        except ClientDisconnected:
            task.close_on_finish = True
        # Popped once written, as waitress's service() pops: the loop flushes without outbuf_lock while
        # `requests` is empty, and did so alongside a worker writing a pipelined probe's answer here.
        self.requests.pop(0)
        request.close()
        if not task.close_on_finish:
            return True
        self.close_when_flushed = True  # what waitress's service() does after a `Connection: close` answer
        for pending in self.requests:
            pending.close()
        self.requests = []
        return False

    def del_channel(self, map: Any = None) -> None:
        if self._body_for is not None:
            self._release_body()
        if self._fileno is not None and self._fileno in self.server.active_channels:
            self.server.forget(self.client)
        super().del_channel(map)


class GuardedServer(TcpWSGIServer):
    """waitress's TCP server with a per-client connection cap and a request deadline."""

    channel_class = GuardedChannel

    def __init__(self, application: Any, limits: Limits, probes: ProbeAnswers | None = None, **kw: Any) -> None:
        self.limits = limits
        self.probes = probes
        self.per_client: Counter[str] = Counter()
        self.refused = 0
        self.cut_requests = 0
        self.bodies_in_flight = 0  # bytes reserved by request bodies being received (loop thread only)
        self.bodies_refused = 0
        self.stalled = 0  # connections closed for taking no byte of the response they were owed
        self.bound_cut: Counter[str] = Counter()  # connections closed past their SendBound, by its `what`
        self.drain_buffer = bytearray(256 * 1024)  # what refused connections still send lands here (loop thread)
        super().__init__(application, **kw)

    def add_task(self, channel: Any) -> None:
        """A channel's next request is complete (waitress holds its requests_lock: the loop thread for a
        connection's first request, a worker thread for the next pipelined one): a health probe with a
        fresh answer is answered here and now; anything else goes to the threads."""
        if channel.close_when_flushed:  # answer_probe answered `Connection: close`: what follows is dropped
            for pending in channel.requests:
                pending.close()
            channel.requests = []
            return
        while self.probes is not None and is_health(channel):
            answer = self.probes.get(channel.requests[0].path)
            if answer is None:
                break
            if not channel.answer_probe(answer) or not channel.requests:
                return
        super().add_task(channel)

    def reserve_body(self, size: int) -> bool:
        if self.bodies_in_flight + size > max(self.limits.bodies_bytes, self.adj.max_request_body_size):
            return False  # one body of the largest allowed size always fits
        self.bodies_in_flight += size
        return True

    def release_body(self, size: int) -> None:
        self.bodies_in_flight = max(0, self.bodies_in_flight - size)

    def forget(self, client: str) -> None:
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def handle_accept(self) -> None:
        try:
            accepted = self.accept()
            if accepted is None:
                return
            conn, addr = accepted
            self.set_socket_options(conn)
        except OSError:  # the peer left before accept finished; waitress logs nothing here either
            return
        client = str(addr[0]).split("%", 1)[0]
        if client not in EXEMPT:
            others = sum(self.per_client.values()) - sum(self.per_client[a] for a in EXEMPT)
            if self.per_client[client] >= self.limits.connections_per_client or others >= CONNECTION_LIMIT:
                self._refuse(conn, client)
                return
        channel = self.channel_class(self, conn, self.fix_addr(addr), self.adj, map=self._map)
        channel.client = client
        self.per_client[client] += 1

    def _refuse(self, conn: socket.socket, client: str) -> None:
        self.refused += 1
        if self.refused % 1000 == 1:  # one line per burst, not one per connection
            log.warning("api: refusing connections from %s (%d open, cap %d per client); %d refused so far",
                        client, self.per_client[client], self.limits.connections_per_client, self.refused)
        body = json.dumps({"error": {"type": "too_many_connections", "message":
                                     "this address holds too many connections to the device"}}).encode()
        try:
            conn.setblocking(False)
            conn.send(REFUSAL % (len(body), body))
        except OSError:  # a full or closed socket: closing is the answer then
            pass
        conn.close()

    def maintenance(self, now: float) -> None:
        mono = time.monotonic()
        for channel in list(self.active_channels.values()):
            if isinstance(channel, GuardedChannel) and channel.total_outbufs_len:
                channel.note_progress(mono)  # before the idle check: taking bytes is activity
        super().maintenance(now)  # idle connections (channel_timeout)
        cutoff = mono - self.limits.request_deadline_s
        for channel in list(self.active_channels.values()):
            linger_until = getattr(channel, "_linger_until", None)
            if linger_until is not None:  # draining a refused request's body
                if mono >= linger_until:  # a refused client still sending (or silent): close it now
                    channel.handle_close()
                continue
            if self._stalled(channel, mono) or self._past_bound(channel, mono):
                continue
            started = getattr(channel, "request_started", None)
            if started is not None and getattr(channel, "requests", None):
                # A pipelined request arrived with one still being served: waitress reads no more of
                # it until that response is done, so its clock starts again from then.
                channel.request_started = time.monotonic()
                continue
            if started is not None and started < cutoff and not channel.will_close \
                    and not channel.close_when_flushed:
                self.cut_requests += 1
                channel.cut()


    def _stalled(self, channel: Any, mono: float) -> bool:
        """Close a connection that owes a response and took no byte of it for send_stall_s (the thread
        writing it, waiting for room in waitress's buffer, gets ClientDisconnected and is free again)."""
        if not isinstance(channel, GuardedChannel):
            return False
        if not channel.total_outbufs_len:
            channel.last_sent = mono  # owes nothing: the clock starts with the next answer
            return False
        if mono - channel.last_sent < self.limits.send_stall_s:
            return False
        self.stalled += 1
        if self.stalled % 100 == 1:  # one line per burst
            log.warning("api: closed a connection from %s that took no byte of its answer for %.0f s "
                        "(%d bytes owed); %d so far", channel.client, mono - channel.last_sent,
                        channel.total_outbufs_len, self.stalled)
        channel.handle_close()
        return True


    def _past_bound(self, channel: Any, mono: float) -> bool:
        """Close a connection whose response is past its SendBound (one line each: a cut needs a
        window's time at least); the thread writing it gets ClientDisconnected, as for a stall."""
        bound = getattr(channel, "bound", None)
        if bound is None:
            return False
        if bound.sent(channel):
            channel.end_bound(bound)  # sent whole (_flush_some ends it as soon as it is)
            return False
        why = bound.breached(channel, mono)
        if why is None:
            return False
        self.bound_cut[bound.what] += 1
        log.warning("api: cut the %s to %s after %.0f s (%d bytes taken): it %s", bound.what, channel.client,
                    mono - bound.started, channel.taken, why)
        channel.end_bound(bound)
        try:  # a reset: what the kernel still holds for the client is dropped, not sent at its pace
            channel.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        channel.handle_close()
        return True


def is_health(channel: Any) -> bool:
    """Whether the request a channel is about to have served is a health probe (GET/HEAD of
    HEALTH_PATHS, received whole: a request waitress refused is an error task for the other threads)."""
    pending = getattr(channel, "requests", None)
    if not pending:
        return False
    request = pending[0]
    return request.error is None and request.command in HEALTH_METHODS and request.path in HEALTH_PATHS


class HealthLane(ThreadedTaskDispatcher):
    """The health probes' own threads (named, so a thread dump shows them)."""

    def start_new_thread(self, target: Callable[[int], None], thread_no: int) -> None:
        threading.Thread(target=target, name=f"http-health-{thread_no}", args=(thread_no,), daemon=True).start()


class LanedDispatcher(ThreadedTaskDispatcher):
    """waitress's thread pool, with health probes sent to a lane of their own (see the module).

    waitress hands a channel to `add_task` when its first complete request arrives (loop thread) and
    again after each request served while more are pipelined (worker thread): the request at the head
    of the channel's queue is the one served next, so each is routed by what it is."""

    def __init__(self) -> None:
        super().__init__()
        self.health = HealthLane()

    def set_thread_count(self, count: int) -> None:
        super().set_thread_count(count)
        self.health.set_thread_count(HEALTH_THREADS if count else 0)  # shutdown sets 0

    def add_task(self, task: Any) -> None:
        if is_health(task):
            self.health.add_task(task)
        else:
            super().add_task(task)

    def shutdown(self, cancel_pending: bool = True, timeout: int = 5) -> bool:
        done: bool = super().shutdown(cancel_pending, timeout)
        return bool(self.health.shutdown(cancel_pending, timeout)) and done


def create_guarded_server(application: Any, limits: Limits, map: dict[int, Any], probes: ProbeAnswers | None = None,
                          **kw: Any) -> GuardedServer:
    """Like waitress.create_server for one TCP listener, with our server class, the probes' answers and
    the health lane."""
    # waitress's limit counts every socket in the map: our channels plus its listener and wake-up pipe.
    adj = Adjustments(connection_limit=CONNECTION_LIMIT + LOOPBACK_RESERVE + 2, **kw)
    if len(adj.listen) > 1:  # a name such as "localhost" may resolve to ::1 and 127.0.0.1
        log.warning("api: %s resolves to %d addresses; serving the first (%s)", kw.get("host"),
                    len(adj.listen), adj.listen[0][3][0])
    dispatcher = LanedDispatcher()
    dispatcher.set_thread_count(adj.threads)
    return GuardedServer(application, limits, probes, map=map, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])


class ConnectionMetrics(Collector):
    """Open connections, refusals and cut requests in /metrics: an attack shows, not only its absence."""

    def __init__(self, server: Callable[[], GuardedServer | None]) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        srv = self.server()
        if srv is None:
            return
        yield GaugeMetricFamily("edge_api_connections", "Open HTTP connections", value=len(srv.active_channels))
        yield CounterMetricFamily("edge_api_connections_refused", "Connections refused at accept "
                                  "(api.connections_per_client or a full table)", value=srv.refused)
        yield CounterMetricFamily("edge_api_requests_cut", "Requests not received whole within "
                                  "api.request_deadline_s (408 and closed)", value=srv.cut_requests)
        yield GaugeMetricFamily("edge_api_request_bodies_bytes", "Request body bytes being received (reserved "
                                "at their head; at most 4x api.max_request_mb)", value=srv.bodies_in_flight)
        yield CounterMetricFamily("edge_api_responses_stalled", "Connections closed for taking no byte of "
                                  "the answer they were owed for 30 s (a client that stopped reading)",
                                  value=srv.stalled)
        cut = CounterMetricFamily("edge_api_responses_cut", "Answers cut for being taken too slowly "
                                  "(api.export_min_kib_s) or for too long (api.export_max_s)", labels=["what"])
        for what in ("export", *sorted(set(srv.bound_cut) - {"export"})):
            cut.add_metric([what], srv.bound_cut[what])
        yield cut
        yield CounterMetricFamily("edge_api_request_bodies_refused", "Requests refused with 503 because too "
                                  "many bodies were arriving at once", value=srv.bodies_refused)
