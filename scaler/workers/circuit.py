"""A circuit toward a failing platform: after repeated failed starts, stop calling it for a while, then try one.

While the platform fails every start (Init answering InternalError, CreateSlot refused), each
failed start fails a request, and the next Assign starts another: measured before this, 2,840 slots
in 15 s for 8 callers. A circuit counts failures in a row; at `trip` it opens: starts are refused at
once, with no platform call, for `open_s` (1 s, doubled at each failed try, at most 10 s). Then it
is half-open: one start goes through as a probe while the others are still refused; the probe's
success closes the circuit, its failure opens it again, for longer. Any success closes it.

The platform worker keeps one circuit for CreateSlot (the platform's own health: a slot is a slot,
whatever the function) and one per function for Init (a function whose Init fails, its code or its
runtime broken, must not stop the others' starts). A refused start, or one whose failure left the circuit
open, is reported as SlotFailed with `retry_after_ms`, the time until the next try, so the controller holds
the function's starts until then rather than start again at the next Assign.
"""

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

log = logging.getLogger("scaler.platform_worker")

TRIP = 5  # failures in a row that open a circuit
FIRST_OPEN_S = 1.0
LONGEST_OPEN_S = 10.0  # a function's next start waits this long at most once the platform works again
HOLD_S = 10.0  # how long a start waits for an open circuit to let it through before it is refused
HOLD_POLL_S = 0.25  # how often a waiting start looks again


@dataclass
class Circuit:
    what: str  # "CreateSlot", "Init of fn": for the log lines
    trip: int = TRIP
    first_open_s: float = FIRST_OPEN_S
    longest_open_s: float = LONGEST_OPEN_S
    clock: Callable[[], float] = time.monotonic
    failures: int = 0  # in a row
    refused: int = 0  # starts refused since it opened
    open_s: float = 0.0  # how long it stays open this time (0: closed)
    _until: float = 0.0  # when the next probe may go
    _probing: bool = False
    _last: str = ""

    @property
    def closed(self) -> bool:
        return self.open_s == 0.0

    def refuses(self) -> float:
        """0 if a call may go now (closed, or it is the half-open circuit's one probe); else seconds until the next
        try."""
        if self.closed:
            return 0.0
        now = self.clock()
        if now >= self._until and not self._probing:
            self._probing = True
            return 0.0
        return max(self._until - now, 0.0) or self.open_s  # a probe under way: say a whole period

    def next_try_ms(self) -> int:
        """While open, the ms until its next probe may go (what SlotFailed.retry_after_ms says); 0 when closed."""
        return 0 if self.closed else max(1, round((self._until - self.clock()) * 1000))

    def succeeded(self) -> None:
        if not self.closed:
            log.warning("%s works again: circuit closed (%d starts were refused while it was open)", self.what,
                        self.refused)  # fmt: skip
        self.failures, self.refused, self.open_s, self._probing = 0, 0, 0.0, False

    def failed(self, why: str) -> None:
        self.failures += 1
        self._last = why
        if self.closed and self.failures < self.trip:
            return
        first = self.closed
        self.open_s = self.first_open_s if first else min(self.open_s * 2, self.longest_open_s)
        self._until = self.clock() + self.open_s
        self._probing = False
        if first:
            log.warning(
                "%s failed %d times in a row (the latest: %s): circuit open, starts refused without calling the"
                " platform; one tried after %gs, then ever less often (at most every %gs) until one succeeds",
                self.what, self.failures, why, self.open_s, self.longest_open_s,
            )  # fmt: skip

    def abandoned(self) -> None:
        """A call let through ended with no verdict (cancelled): the next one may probe."""
        self._probing = False

    @property
    def last(self) -> str:
        return self._last


@dataclass
class Circuits:
    """CreateSlot's circuit, and Init's per function: kept while a start of the function is under way, or while
    its circuit remembers failures; a function whose starts work costs nothing."""

    trip: int = TRIP
    first_open_s: float = FIRST_OPEN_S
    longest_open_s: float = LONGEST_OPEN_S
    hold_s: float = HOLD_S
    clock: Callable[[], float] = time.monotonic
    create: Circuit = field(init=False)
    _init: dict[str, Circuit] = field(default_factory=dict)
    _starting: Counter[str] = field(default_factory=Counter)  # starts under way, by function

    def __post_init__(self) -> None:
        self.create = self._circuit("CreateSlot")

    def init(self, key: str) -> Circuit:
        circuit = self._init.get(key)
        if circuit is None:
            circuit = self._init[key] = self._circuit(f"Init of {key!r}")
        return circuit

    def _circuit(self, what: str) -> Circuit:
        return Circuit(what, self.trip, self.first_open_s, self.longest_open_s, self.clock)

    @contextlib.contextmanager
    def starting(self, key: str) -> Iterator[None]:
        """Around one start of `key`: its Init circuit stays while any is under way."""
        self._starting[key] += 1
        try:
            yield
        finally:
            self._starting[key] -= 1
            if not self._starting[key]:
                del self._starting[key]
                circuit = self._init.get(key)
                if circuit is not None and circuit.closed and not circuit.failures:
                    del self._init[key]
