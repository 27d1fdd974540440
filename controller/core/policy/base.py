"""What a policy decides, and the defaults the challenge's demo scaler uses."""

from dataclasses import dataclass

from controller.core.state import FnState, Instance, Phase


@dataclass(frozen=True)
class KeepAlive:
    until_ms: int
    why: str


class Policy:
    """The choices the core leaves open. Pure: state and `now` in, a choice out.

    The core does the bookkeeping (queueing, matching, replies); a policy only says which idle
    instance to reuse, how many instances to start for waiting requests, how long an idle
    instance stays, and when it next wants to be asked (`next_wake_ms`).
    """

    name = "base"

    def pick(self, s: FnState, idle: list[Instance], now: int) -> Instance:
        """The idle instance that serves the next waiting request: the most recently idled one."""
        return max(idle, key=lambda i: (i.since_ms, i.id))

    def starts_for_queue(self, s: FnState, uncovered: int, now: int) -> int:
        """How many instances to start for `uncovered` waiting requests no start covers yet."""
        return uncovered

    def keep_alive(self, s: FnState, inst: Instance, now: int) -> KeepAlive:
        raise NotImplementedError

    def next_wake_ms(self, s: FnState) -> int | None:
        """When the policy next wants a Tick: by default the earliest keep-alive deadline."""
        deadlines = [i.keep_until_ms for i in s.instances.values() if i.phase is Phase.IDLE and i.keep_until_ms]
        return min(deadlines, default=None)


@dataclass(frozen=True)
class FixedKeepAlive(Policy):
    """Reuse the most recently idled instance, cold-start on a miss, keep idle ones a fixed time."""

    keep_alive_ms: int = 5 * 60_000
    name: str = "demo"

    def keep_alive(self, s: FnState, inst: Instance, now: int) -> KeepAlive:
        return KeepAlive(now + self.keep_alive_ms, f"fixed keep-alive {self.keep_alive_ms / 1000:g}s")
