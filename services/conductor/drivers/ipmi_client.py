"""IPMI plumbing for the ``ipmitool`` interfaces: a bounded cache of pyghmi
sessions per BMC, and pyghmi's errors mapped onto Ferrum's error tree
(driver_info parsing is ipmi_info.py, shared with the console).

pyghmi is synchronous (its ``Command`` waits on UDP answers), so everything
here that touches the network runs in a worker thread; the cache is guarded
by a thread lock for that reason.

Two things pyghmi does not do by itself, done here:

* **A chosen cipher suite.** pyghmi's client always proposes suite 17
  (HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128) and falls back to suite 3
  (HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128) only when the BMC answers the
  proposal with an error; it never checks which algorithms the BMC accepted.
  A BMC that answers "yes, suite 3" to a suite-17 proposal (pyghmi's own BMC
  server, hence Ferrum's simulator) then fails the handshake with a struct
  error. :class:`_SuiteSession` proposes exactly ``ipmi_cipher_suite`` and
  checks the answer, so a mismatch is a clear error, not a hang or a crash.
* **A deadline.** pyghmi gives up on a silent BMC by its own retry timers
  (a few seconds per attempt); :meth:`SessionCache.call` retries with a
  fresh session within ``ipmi_timeout`` and names the BMC when it gives up.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

import pyghmi.exceptions as pyghmi_exc
import pyghmi.ipmi.private.constants as pyghmi_constants
import pyghmi.ipmi.private.session as pyghmi_session
import pyghmi.ipmi.private.util as pyghmi_util
from pyghmi.ipmi.command import Command

from services.common import errors, pyghmi_io
from services.conductor.drivers.ipmi_info import (  # noqa: F401 - re-exported for the interfaces and tests
    CIPHER_SUITES,
    DEFAULT_CIPHER_SUITE,
    DEFAULT_PORT,
    DRIVER_INFO_PROPERTIES,
    PRIV_LEVELS,
    IpmiInfo,
    parse_driver_info,
)

LOG = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds a session may go unheard before it is replaced rather than trusted: IPMI's default
# session inactivity timeout is 60 s, after which a BMC silently ignores the session's packets.
# The keep-alive (``ipmi_keepalive_interval``) keeps every cached session well inside it.
SESSION_TRUST = 50.0
# A session unheard for longer is still tried first, but given only this long to answer before
# a new one is opened: a BMC that kept it (keep-alives fell behind, the BMC's timeout is longer)
# costs one round trip, one that dropped it (it ignores the packets) at most this wait.
STALE_PROBE = 2.0
KEEPALIVE_WORKERS = 8  # threads sending keep-alives (one request each, a round trip at a time)
KEEPALIVE_TICK = 1.0  # seconds between looks for sessions due a keep-alive
KEEPALIVE_TIMEOUT = 5.0  # seconds a keep-alive may take before the session is dropped
LOGIN_STAGES = {  # pyghmi's session context -> the login step that went unanswered
    "": "its channel authentication capabilities request",
    "OPENSESSION": "the RMCP+ open session request",
    "EXPECTINGRAKP2": "RAKP message 1 (BMCs ignore a user they do not know)",
    "EXPECTINGRAKP4": "RAKP message 3",
}

pyghmi_io.install()  # pyghmi's shared socket I/O, safe for many threads (services/common/pyghmi_io.py)


# ---- pyghmi sessions with a fixed cipher suite ------------------------------------------


class _SuiteSession(pyghmi_session.Session):  # pyghmi ships no type hints: Any as far as mypy knows
    """A pyghmi client session that proposes exactly one cipher suite and checks the BMC's answer."""

    cipher_suite: ClassVar[int] = DEFAULT_CIPHER_SUITE
    # time.monotonic() after which an unanswered packet ends the login or command instead of
    # being sent again: pyghmi restarts a login whose RAKP 2 never comes forever (a BMC that
    # ignores an unknown user does that), which would hold a worker thread for good.
    deadline: float | None = None
    # pyghmi's own attributes this class reads (untyped there)
    lastpayload: Any
    logged: Any
    logging: Any
    incommand: Any
    sessioncontext: Any

    def __new__(cls, bmc: str, userid: str, password: str, port: int = DEFAULT_PORT, **_: Any) -> Any:
        # pyghmi's ``Session.__new__`` hands out an existing session for the same BMC and
        # credentials, whatever its cipher suite or privilege, and (comparing the encoded user
        # name with the given one) keeps returning the first session ever made for them from
        # ``initting_sessions`` even once it is broken. The cache owns reuse here: every
        # session is new, on a local socket no other session to this BMC uses (pyghmi routes
        # answers by BMC address and local port).
        self = object.__new__(cls)
        forbidden: list[Any] = []
        try:
            found = socket.getaddrinfo(bmc, port, 0, socket.SOCK_DGRAM)
        except OSError as exc:
            raise pyghmi_exc.IpmiException(f"Unable to resolve {bmc}: {exc}") from exc
        for family, _type, _proto, _name, address in found:
            key: Any = address
            if pyghmi_session.ipv6support and family == socket.AF_INET:
                key = (f"::ffff:{address[0]}", address[1], 0, 0)  # how pyghmi keys its sessions
            forbidden.extend(s.socket for s in list(cls.bmc_handlers.get(key, {}).values()))
        self.forbidsock = forbidden
        return self

    def __init__(self, *args: Any, deadline: float | None = None, **kwargs: Any) -> None:
        self.deadline = deadline
        super().__init__(*args, **kwargs)

    def _timedout(self) -> None:
        if self.deadline is None or time.monotonic() < self.deadline or not self.lastpayload:
            super()._timedout()
            return
        self.lastpayload = None  # no more resends
        if self.logging and not self.logged:
            stage = LOGIN_STAGES.get(self.sessioncontext or "", "login")
            self.onlogon({"error": f"timeout: no answer from the BMC to {stage}"})
        else:
            self.logged = 0  # a BMC that stopped answering gets no close-session request either
            self.incommand = False
            self._mark_broken("timeout: the BMC stopped answering")

    def _xmit_packet(self, retry: bool = True, delay_xmit: Any = None, timeout: Any = None) -> None:
        super()._xmit_packet(retry=retry, delay_xmit=delay_xmit, timeout=timeout)
        if self.deadline is None:
            return
        # Give up at the deadline, not at the end of the retry interval that spans it
        # (pyghmi's clock is os.times()'s elapsed time, not time.monotonic()).
        deadline = self.deadline - time.monotonic() + pyghmi_util._monotonic_time()
        with pyghmi_util.protect(pyghmi_session.WAITING_SESSIONS):
            waiting = self.waiting_sessions.get(self)
            if waiting is not None and waiting["timeout"] > deadline:
                waiting["timeout"] = self.expiration = deadline

    def _initsession(self) -> None:
        super()._initsession()
        # pyghmi's switch between its two proposals: 1 = suite 3 (SHA-1), 256 = suite 17 (SHA-256).
        self.attemptedhash = 1 if self.cipher_suite == 3 else 256

    def _got_rmcp_response(self, data: Any) -> Any:
        opening = self.sessioncontext and self.sessioncontext != "ESTABLISHED"
        if opening and len(data) > 1 and data[0] == self.rmcptag:
            if data[1] != 0:  # pyghmi would fall back to suite 3 here; the operator chose one
                reason = pyghmi_constants.rmcp_codes.get(data[1], f"RMCP+ status {data[1]}")
                self.onlogon({"error": f"the BMC refused cipher suite {self.cipher_suite}: {reason}"})
                return -9
            wanted = CIPHER_SUITES[self.cipher_suite]
            offered = tuple(data[i] & 0x3F for i in (16, 24, 32)) if len(data) >= 36 else ()
            if offered != wanted:
                other = next((s for s, algos in CIPHER_SUITES.items() if algos == offered), None)
                what = f"cipher suite {other}" if other is not None else f"algorithms {offered}"
                self.onlogon(
                    {"error": f"the BMC answered cipher suite {self.cipher_suite} with {what}: wrong ipmi_cipher_suite"}
                )
                return -9
        return super()._got_rmcp_response(data)


class _Suite3Session(_SuiteSession):
    cipher_suite = 3


class _Suite17Session(_SuiteSession):
    cipher_suite = 17


SESSION_CLASSES: Mapping[int, type[_SuiteSession]] = {3: _Suite3Session, 17: _Suite17Session}


def _detach_keepalive(session: Any) -> None:
    """Take a logged-in session out of pyghmi's keep-alive table; the cache keeps it alive.

    pyghmi sends its keep-alives from whichever thread happens to wait in
    ``Session.wait_for_rsp`` (a login), on sessions another thread may be
    using, and that wait walks the whole table (twice) on every wake-up:
    with 10,000 sessions each login cost milliseconds of CPU in that walk
    alone. Without the entry pyghmi never logs the session out for idling,
    and its validity check falls back to ``broken``."""
    with pyghmi_util.protect(pyghmi_session.KEEPALIVE_SESSIONS):
        pyghmi_session.Session.keepalive_sessions.pop(session, None)


class IpmiCommand(Command):  # pyghmi ships no type hints: Any as far as mypy knows
    """pyghmi's ``Command`` over a session of the chosen cipher suite.

    ``Command.__init__`` always builds a plain pyghmi session; this sets the
    same attributes around one of ours."""

    def __init__(self, info: IpmiInfo, deadline: float | None = None) -> None:
        self.onlogon = None
        self.bmc = info.address
        self._sdrcachedir = None
        self._sdr = None
        self._oem = None
        self._oemknown = False
        self._netchannel = None
        self._ipv6support = None
        self.certverify = None
        self.kwargs: dict[str, Any] = {}
        self.ipmi_session = SESSION_CLASSES[info.cipher_suite](
            bmc=info.address,
            userid=info.username,
            password=info.password,
            port=info.port,
            privlevel=PRIV_LEVELS[info.priv_level],
            deadline=deadline,
        )
        self.created = time.monotonic()
        self.last_used = self.created

        _detach_keepalive(self.ipmi_session)

    def usable(self) -> bool:
        session = self.ipmi_session
        return not session.broken and bool(session.logged)

    def stale(self) -> bool:
        """Unheard for longer than a BMC may keep an idle session: try it, briefly."""
        return time.monotonic() - self.last_used > SESSION_TRUST

    def logout(self) -> None:
        """Close the session at the BMC without waiting for an answer (best effort)."""
        try:
            self.ipmi_session.logout(False)
        except Exception as exc:  # noqa: BLE001 - the BMC may be gone; its session expires on its own
            LOG.debug("ipmi logout failed bmc=%s: %s", self.bmc, exc)


# ---- errors ------------------------------------------------------------------------------

_AUTH_MARKERS = (
    "incorrect password",
    "unauthorized name",
    "invalid role",
    "unauthorized role",
    "privilege level",
    "kg?)",
)
_TRANSIENT_MARKERS = ("timeout", "no longer connected", "unable to transmit", "session failed to initialize")


_COMPLETION_CODES = {str(text).lower(): code for code, text in pyghmi_constants.ipmi_completion_codes.items()}
_BUSY_CODES = (0xC0, 0xC3, 0xCE)  # node busy, timeout, cannot respond: worth another try


class _Permanent(errors.BMCError):
    """A failure another attempt cannot fix (credentials, cipher suite, a refused command)."""


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def map_error(info: IpmiInfo, action: str, exc: BaseException) -> errors.BMCError:
    """A clear BMCError for a pyghmi failure; ``_Permanent`` when retrying cannot help."""
    text = _message(exc)
    low = text.lower()
    where = info.describe()
    if "cipher suite" in low:
        return _Permanent(
            f"IPMI session to {where} failed while trying to {action}: {text} "
            f"(ipmi_cipher_suite is {info.cipher_suite})"
        )
    if any(marker in low for marker in _AUTH_MARKERS):
        return _Permanent(
            f"IPMI authentication failed for {where} while trying to {action} ({text}): check ipmi_username, "
            f"ipmi_password and ipmi_priv_level ({info.priv_level})"
        )
    if isinstance(exc, pyghmi_exc.IpmiException) and not any(m in low for m in _TRANSIENT_MARKERS):
        # The BMC answered with a completion code: it will answer the same again. pyghmi's
        # helpers often raise with the code's text only, so the text identifies it too.
        code = getattr(exc, "ipmicode", 0) or _COMPLETION_CODES.get(low, 0)
        if code and code != 0xFFFF and code not in _BUSY_CODES:
            return _Permanent(f"IPMI BMC at {where} refused to {action}: {text} (completion code {code:#x})")
    if isinstance(exc, OSError):
        return errors.BMCError(f"IPMI BMC at {where} is unreachable while trying to {action}: {text}")
    if any(marker in low for marker in ("timeout", "no longer connected")):
        return errors.BMCError(
            f"IPMI BMC at {where} did not answer while trying to {action} ({text}): is the address or "
            "ipmi_port wrong, the BMC down, or the user unknown to it (some BMCs ignore unknown users)?"
        )
    return errors.BMCError(f"IPMI BMC at {where} failed to {action}: {text}")


# ---- the session cache -------------------------------------------------------------------


class _Entry:
    """One cache slot: the command (None until connected) and a lock that serialises calls to one BMC."""

    __slots__ = ("command", "evicted", "lock", "pinging")

    def __init__(self) -> None:
        self.command: IpmiCommand | None = None
        self.lock = threading.Lock()
        self.pinging = False  # a keep-alive is queued or running
        self.evicted = False  # out of the cache: whoever holds the lock last logs out


class SessionCache:
    """pyghmi commands per BMC, credentials and cipher suite, shared by a conductor's interfaces.

    Calls to one BMC are serialised (IPMI sessions carry one request at a
    time). Sessions live across power-sync cycles: one idle for
    ``keepalive_interval`` gets a Get Device ID (``KEEPALIVE_WORKERS``
    threads send them), so the BMC never times it out; a session whose
    request or keep-alive failed, or that went unheard for ``SESSION_TRUST``
    (keep-alives off or starved), is logged out and replaced by the next
    call. At most ``max_sessions`` are kept, the least recently used going
    first. ``created`` counts the sessions opened, ``keepalives`` the
    keep-alives answered.
    """

    def __init__(
        self, *, timeout: float = 10.0, retries: int = 3, max_sessions: int = 1024, keepalive_interval: float = 30.0
    ) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[tuple[Any, ...], _Entry] = collections.OrderedDict()
        self.timeout = timeout
        self.retries = max(1, retries)
        self.max_sessions = max(1, max_sessions)
        self.keepalive_interval = max(0.0, keepalive_interval)
        self.created = 0
        self.keepalives = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._keepalive_pool: ThreadPoolExecutor | None = None

    def _entry(self, info: IpmiInfo) -> _Entry:
        key = info.cache_key()
        evicted: list[_Entry] = []
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_sessions:
                old_entry = self._entries.popitem(last=False)[1]
                old_entry.evicted = True
                evicted.append(old_entry)
            if self._keeper is None and self.keepalive_interval > 0 and not self._stop.is_set():
                self._start_keeper()
        for old in evicted:
            self._drop(old, wait=0.0)
        return entry

    # ---- keep-alive ---------------------------------------------------------------------

    def _start_keeper(self) -> None:
        """The thread that finds idle sessions and its pool that pings them (under ``_lock``)."""
        self._keepalive_pool = ThreadPoolExecutor(max_workers=KEEPALIVE_WORKERS, thread_name_prefix="ipmi-keepalive")
        self._keeper = threading.Thread(target=self._keep_sessions_alive, name="ipmi-keepalive-sweep", daemon=True)
        self._keeper.start()

    def _keep_sessions_alive(self) -> None:
        tick = min(KEEPALIVE_TICK, self.keepalive_interval / 4)
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                due = [
                    (e.command.last_used, i, e)
                    for i, e in enumerate(self._entries.values())
                    if e.command is not None and not e.pinging and now - e.command.last_used >= self.keepalive_interval
                ]
            due.sort()  # the longest idle first: when keep-alives fall behind, the nearest to expiry go first
            for _, _, entry in due:
                entry.pinging = True
            pool = self._keepalive_pool
            for _, _, entry in due:
                if pool is None or self._stop.is_set():
                    entry.pinging = False
                    continue
                try:
                    pool.submit(self._keep_alive, entry)
                except RuntimeError:  # the pool shut down under us (close)
                    entry.pinging = False

    def _keep_alive(self, entry: _Entry) -> None:
        """One keep-alive: Get Device ID, which every BMC answers; a session that
        fails it is dropped (the next call opens a new one). A session in use is
        skipped: its request keeps it alive."""
        try:
            if self._stop.is_set() or not entry.lock.acquire(blocking=False):
                return
            try:
                command = entry.command
                if command is None or time.monotonic() - command.last_used < self.keepalive_interval:
                    return
                if not command.usable():
                    entry.command = None
                    command.logout()
                    return
                session = command.ipmi_session
                wait = STALE_PROBE if command.stale() else min(self.timeout, KEEPALIVE_TIMEOUT)
                session.deadline = time.monotonic() + wait
                try:
                    command.raw_command(netfn=6, command=1)
                except Exception as exc:  # noqa: BLE001 - any failure: the session is not to be trusted
                    LOG.info(
                        "ipmi keep-alive failed bmc=%s: %s; the next request opens a new session", command.bmc, exc
                    )
                    entry.command = None
                    command.logout()
                    return
                finally:
                    session.deadline = None
                command.last_used = time.monotonic()
                with self._lock:
                    self.keepalives += 1
                if entry.evicted:  # evicted while this ran (its logout was skipped): do it now
                    entry.command = None
                    command.logout()
            finally:
                entry.lock.release()
        finally:
            entry.pinging = False

    @staticmethod
    def _drop(entry: _Entry, wait: float | None = None) -> None:
        """Log out ``entry``'s session; skipped when a call holds it (it ends on its own)."""
        if not entry.lock.acquire(timeout=-1 if wait is None else wait):
            return
        try:
            command, entry.command = entry.command, None
        finally:
            entry.lock.release()
        if command is not None:
            command.logout()

    def sessions(self) -> list[IpmiCommand]:
        with self._lock:
            return [e.command for e in self._entries.values() if e.command is not None]

    def call(self, info: IpmiInfo, action: str, fn: Callable[[IpmiCommand], T], *, deadline: float | None = None) -> T:
        """Run ``fn(command)`` against the node's BMC, reusing its session, retrying
        transient failures with a fresh one until ``ipmi_retries`` attempts or the
        deadline. Blocking: call it in a thread."""
        deadline = deadline if deadline is not None else time.monotonic() + self.timeout
        entry = self._entry(info)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not entry.lock.acquire(timeout=remaining):
            raise errors.BMCError(
                f"IPMI BMC at {info.describe()} did not become free within {self.timeout:g}s to {action} "
                "(earlier requests to it are still waiting for answers)"
            )
        try:
            last: errors.BMCError | None = None
            for attempt in range(1, self.retries + 1):
                if time.monotonic() >= deadline:
                    break
                try:
                    command = entry.command
                    if command is not None and not command.usable():
                        entry.command = None
                        command.logout()
                        command = None
                    if command is None:
                        LOG.debug("ipmi connect bmc=%s suite=%s", info.describe(), info.cipher_suite)
                        command = IpmiCommand(info, deadline)
                        with self._lock:
                            self.created += 1
                        entry.command = command
                    stale = command.stale()
                    command.ipmi_session.deadline = min(deadline, time.monotonic() + STALE_PROBE) if stale else deadline
                    try:
                        result = fn(command)
                    finally:
                        command.ipmi_session.deadline = None
                    command.last_used = time.monotonic()
                    return result
                except errors.FerrumError:
                    raise  # our own checks inside ``fn`` (an unknown power state): not the session's fault
                except Exception as exc:  # pyghmi raises IpmiException, OSError, struct.error and more
                    last = map_error(info, action, exc)
                    broken, entry.command = entry.command, None
                    if broken is not None:
                        broken.logout()
                    if isinstance(last, _Permanent):
                        raise errors.BMCError(str(last)) from exc
                    LOG.info(
                        "ipmi attempt failed bmc=%s action=%r attempt=%d/%d: %s",
                        info.describe(),
                        action,
                        attempt,
                        self.retries,
                        last,
                    )
            if last is None:
                raise errors.BMCError(
                    f"IPMI BMC at {info.describe()} gave no answer within {self.timeout:g}s to {action}"
                )
            raise errors.BMCError(f"{last} (gave up after {attempt} attempt(s) within {self.timeout:g}s)")
        finally:
            entry.lock.release()

    def close(self) -> None:
        """Stop the keep-alives and log out of every cached session. Blocking: call in a thread."""
        self._stop.set()
        with self._lock:
            entries, self._entries = list(self._entries.values()), collections.OrderedDict()
            keeper, pool = self._keeper, self._keepalive_pool
        if keeper is not None:
            keeper.join(timeout=KEEPALIVE_TICK + 1.0)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # each keep-alive ends by its own deadline
        for entry in entries:
            self._drop(entry, wait=1.0)

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for e in self._entries.values() if e.command is not None)
