"""An example policy from outside the project (docs/policies.md: Writing a policy).

Every idle instance gets the same budget of idle memory: a 128 MB instance stays 16 times as long as a
2 GB one. Run it with `PYTHONPATH=docs/examples scaler simulate DATASET --offline --policy
my_policy:EqualIdleMemory`, or `scaler up --policy my_policy:EqualIdleMemory`.
"""

from dataclasses import dataclass

from scaler.controller.core.policy import KeepAlive, Policy


@dataclass(frozen=True)
class EqualIdleMemory(Policy):
    """Keep an idle instance until it has held `budget_gb_s` of idle memory, between `floor_ms` and `cap_ms`."""

    budget_gb_s: float = 60.0  # a 1 GB instance stays a minute, a 128 MB one eight
    floor_ms: int = 10_000
    cap_ms: int = 30 * 60_000

    def keep_alive(self, s, inst, now) -> KeepAlive:
        gb = max(inst.memory_mb, 1) / 1024
        keep_ms = min(self.cap_ms, max(self.floor_ms, round(self.budget_gb_s / gb * 1000)))
        return KeepAlive(now + keep_ms, f"equal idle memory: {self.budget_gb_s:g} GB·s over {gb:g} GB")
