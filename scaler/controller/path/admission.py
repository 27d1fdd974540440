"""Admission: whether a node takes one more Assign, or refuses it at once because it is behind.

A new Assign is refused while the node is behind: when the oldest command not yet decided arrived
more than `max_behind_s` ago, or the event loop itself runs that late (calls queue in gRPC before
they reach us; a weighted mean, so a burst of a second or two is absorbed), or the loop's watcher has
been quiet that long (a process stopped or a loop held: the calls that waited it out may reach us before
the watcher's next word); or when `max_backlog`
commands wait to be decided (memory and latency stay bounded). Only Assigns: an Idle frees an
instance (refusing it would only bring it back later), and reports and ticks keep the state moving.
And never while the event store is in trouble: then the backlog is the store's, not overload, and
the calls say so themselves (UNAVAILABLE). Pure: the clock is given, nothing here waits.
"""

import itertools
import time
from collections import deque
from collections.abc import Callable

from scaler.proto.commands import AnyCommand, Assign, Code, Reply

MAX_BEHIND_S = 2.0
MAX_BACKLOG = 4096
WATCH_EVERY_S = 0.05  # how often the node's watcher times the event loop (`lagged`)


class Admission:
    def __init__(
        self,
        max_backlog: int = MAX_BACKLOG,
        max_behind_s: float = MAX_BEHIND_S,
        clock: Callable[[], float] = time.monotonic,
        watch_every_s: float = WATCH_EVERY_S,
    ) -> None:
        self.max_backlog = max_backlog
        self.max_behind_s = max_behind_s
        self.clock = clock
        self.watch_every_s = watch_every_s
        self.backlog = 0  # commands between their arrival and their decision stored
        self._lag_s = 0.0  # how late the event loop runs timers, rising at once and falling slowly
        self._heard: float | None = None  # when the watcher last said (None: no watcher, as in a test)
        self.refused = 0  # Assigns refused for overload, since start
        self._arrivals: deque[tuple[float, int]] = deque()  # (when, token) of those commands, oldest first
        self._decided: set[int] = set()  # tokens decided but still in `_arrivals` behind an older one
        self._tokens = itertools.count()

    def arrived(self) -> int:
        """A command arrived to be decided; its token for `decided`."""
        token = next(self._tokens)
        self.backlog += 1
        self._arrivals.append((self.clock(), token))
        return token

    def decided(self, token: int) -> None:
        self.backlog -= 1
        self._decided.add(token)

    def lagged(self, lag_s: float) -> None:
        """The event loop ran the watcher's timer (due every `watch_every_s`) `lag_s` late."""
        self._heard = self.clock()
        self._lag_s = lag_s if lag_s > self._lag_s else 0.9 * self._lag_s + 0.1 * lag_s

    def unwatched(self) -> None:
        """The watcher stopped: its silence says nothing of the loop from now on."""
        self._heard = None

    @property
    def lag_s(self) -> float:
        """How late the event loop runs: as the watcher last said, or as long as it has been quiet past its due."""
        quiet = self.clock() - self._heard - self.watch_every_s if self._heard is not None else 0.0
        return max(self._lag_s, quiet)

    def behind_s(self) -> float:
        """How long the oldest command not yet decided has been waiting."""
        while self._arrivals and self._arrivals[0][1] in self._decided:
            self._decided.discard(self._arrivals.popleft()[1])
        return self.clock() - self._arrivals[0][0] if self._arrivals else 0.0

    def over(self) -> bool:
        """Whether a new Assign would be refused, were the event store well: a cheap look before `refuse` asks
        whether it is."""
        return self.backlog >= self.max_backlog or max(self.behind_s(), self.lag_s) >= self.max_behind_s

    def refuse(self, cmd: AnyCommand, node: str, store_troubled: bool = False) -> Reply | None:
        """The answer refusing `cmd` for overload, or None to take it."""
        if store_troubled or not isinstance(cmd, Assign) or not self.over():
            return None
        behind = max(self.behind_s(), self.lag_s)
        self.refused += 1
        message = (
            f"node {node} is overloaded ({self.backlog} commands waiting to be decided, {behind:.1f}s"
            " behind); try again shortly"
        )
        return Reply(to=cmd.reply_to, request_id=cmd.request_id, code=Code.RESOURCE_EXHAUSTED, message=message)
