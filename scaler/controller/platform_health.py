"""Whether the platform is failing starts, seen over all of a node's functions.

The platform worker's circuits hold a function's starts once its own starts have failed (StartsHeld),
but a warm function learns of a failing platform only at its own next start: the learned policy
retires its idle instances between bursts and pre-warms for the next one, and with every Init or
CreateSlot failing, that pre-warm fails and the burst finds no instance. So a failed start of any
function, with none succeeded since, keeps every function's idle instances (Room.starts_failing_until_ms)
for a while: a failing platform never turns a warm function cold.
"""

from dataclasses import dataclass

from scaler.proto.commands import AnyCommand, SlotFailed, SlotReady

# How long after the last failed start (with no start succeeded since) idle instances are kept: a failing
# platform's starts keep failing more often than this (the worker's circuit tries one at least every 10 s).
FAILING_HOLD_MS = 20_000


@dataclass
class StartsFailing:
    failed_ms: int = 0  # the last failed start of any function
    ready_ms: int = 0  # the last start that succeeded

    def saw(self, cmd: AnyCommand, now: int) -> None:
        if isinstance(cmd, SlotFailed):
            self.failed_ms = now
        elif isinstance(cmd, SlotReady):
            self.ready_ms = now

    def until_ms(self, now: int) -> int:
        """Until when idle instances are kept (0: the platform is not failing starts)."""
        if self.failed_ms <= self.ready_ms or now >= self.failed_ms + FAILING_HOLD_MS:
            return 0
        return self.failed_ms + FAILING_HOLD_MS
