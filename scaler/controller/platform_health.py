"""Whether the platform is failing starts, seen over all of a node's functions.

The platform worker's circuits hold a function's starts once its own starts have failed (StartsHeld),
but a warm function learns of a failing platform only at its own next start: the learned policy
retires its idle instances between bursts and pre-warms for the next one, and with every Init or
CreateSlot failing, that pre-warm fails and the burst finds no instance. So failed starts of two
functions or more, with none succeeded since, keep every function's idle instances for a while
(Room.starts_failing_until_ms): a failing platform never turns a warm function cold. One function
whose Init keeps failing (its code broken) is that function's trouble, not the platform's: it keeps
nothing of the others.
"""

from dataclasses import dataclass, field

from scaler.proto.commands import AnyCommand, SlotFailed, SlotReady

# How long after the last failed start (with no start succeeded since) idle instances are kept: a failing
# platform's starts keep failing more often than this (the worker's circuit tries one at least every 10 s).
FAILING_HOLD_MS = 20_000
FAILING_FUNCTIONS = 2  # functions whose starts failed since the last that succeeded: the platform's, not theirs


@dataclass
class StartsFailing:
    failed_ms: int = 0  # the last failed start of any function
    failed: set[str] = field(default_factory=set)  # the functions whose starts failed since one succeeded

    def saw(self, cmd: AnyCommand, now: int) -> None:
        if isinstance(cmd, SlotFailed):
            if now >= self.failed_ms + FAILING_HOLD_MS:  # the failures before are too old to count with this one
                self.failed.clear()
            self.failed_ms = now
            self.failed.add(cmd.key)
        elif isinstance(cmd, SlotReady):
            self.failed.clear()

    def until_ms(self, now: int) -> int:
        """Until when idle instances are kept (0: the platform is not failing starts)."""
        if len(self.failed) < FAILING_FUNCTIONS or now >= self.failed_ms + FAILING_HOLD_MS:
            return 0
        return self.failed_ms + FAILING_HOLD_MS
