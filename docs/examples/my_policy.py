"""An example policy from outside the project (docs/policies.md: A policy from outside the project).

Every idle instance gets the same budget of idle memory: a 128 MB instance stays eight times as long as a
1 GB one. Run it with `PYTHONPATH=docs/examples scaler simulate DATASET --offline --policy
my_policy:EqualIdleMemory`, or `scaler up --policy my_policy:EqualIdleMemory`.
"""

from typing import Annotated

import msgspec

from scaler.controller.core.policy import UNSEEN, KeepAlive, Policy, PolicyConfig


class EqualIdleMemoryConfig(PolicyConfig, frozen=True, kw_only=True):
    budget_gb_s: Annotated[float, msgspec.Meta(description="idle memory x time each idle instance may hold")] = 60.0
    floor_ms: Annotated[int, msgspec.Meta(description="the shortest keep-alive")] = 10_000
    cap_ms: Annotated[int, msgspec.Meta(description="the longest keep-alive")] = 30 * 60_000


class EqualIdleMemory(Policy):
    name = "equal-idle-memory"
    Config = EqualIdleMemoryConfig

    def keep_alive(self, s, f, inst, now, run=UNSEEN) -> KeepAlive:
        c, gb = self.config, max(inst.memory_mb, 1) / 1024
        keep_ms = min(c.cap_ms, max(c.floor_ms, round(c.budget_gb_s / gb * 1000)))
        return KeepAlive(now + keep_ms, f"equal idle memory: {c.budget_gb_s:g} GB·s over {gb:g} GB")
