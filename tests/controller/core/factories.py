"""Small builders for core tests: commands and events with sensible defaults."""

from scaler.controller.core import folds
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.policy import get_policy
from scaler.controller.core.policy.base import Capability, FixedKeepAlive
from scaler.controller.core.state import FnState
from scaler.proto import commands as c
from scaler.proto import events as e

KEY = "fn"
META = e.Meta(memory_mb=512, runtime="python", timeout_s=60)
DEMO = get_policy("demo")
# The demo's choices with pooled starts (as `learned` has them): whoever waits longest takes the
# first instance ready, whichever request it was started for.


class Pooled(FixedKeepAlive):
    capabilities = Capability.NONE


POOLED = Pooled(DEMO.config, name="demo")


def assign(r: str = "r1", to: str = "", meta: e.Meta = META) -> c.Assign:
    return c.Assign(key=KEY, request_id=r, meta=meta, reply_to=to or f"to-{r}")


def idle(r: str = "r1", i: str = "fn-1", **kw) -> c.Idle:
    return c.Idle(key=KEY, request_id=r, instance_id=i, reply_to=f"to-idle-{r}", **kw)


def ready(i: str = "fn-1", slot: str = "s1") -> c.SlotReady:
    return c.SlotReady(key=KEY, instance_id=i, slot_id=slot, create_ms=100, init_ms=50)


def run(*cmds, at: int = 0, step: int = 10, policy=DEMO, s: FnState | None = None, f: FnStats = NO_STATS):
    """Decide each command in turn, `step` ms apart, from the state `s` and its features `f`; return the final state
    and every decision (the last one's `features` are the final features)."""
    s = s or FnState(key=KEY)
    decisions = []
    for n, cmd in enumerate(cmds):
        d = decide(s, cmd, at + n * step, policy, features=f)
        assert folds.replay(s, f, d.events) == (d.state, d.features), "Decision.state must equal the replayed events"
        decisions.append(d)
        s, f = d.state, d.features
    return s, decisions
