"""Why `learned` does not switch to holding everything: the score's two regimes, on `gen-burst` seeds.

    .venv/bin/python bench/regimes.py [--seeds 0 1 2 3 4 5] [--from-minutes 0 3 6] [--trace burst]

The score adds two convex terms (50 E_gb / S and 50 E / (E + W)), so it can peak at either end: where
`learned` stands (little slot time, waiting where memory costs more) or holding every instance
through every lull (`histogram`'s 4-hour keep-alive: only a function's first burst waits). On
generated seed 0's `gen-burst` the second end scores more. This runs `learned`, then `learned`
switched to holding from minute M of the run on (its exchange rate set to HOLDING_GB GB·s per
second of waiting from then on), and `histogram`, on each seed, and prints one Markdown row per seed.
"""

import argparse
import sys

from scaler.controller.core.policy import Policy, get_policy
from scaler.controller.core.policy.learned import Learned, LearnedConfig
from scaler.controller.ledger import Ledger
from scaler.proto.commands import AnyCommand
from scaler.simulator import shapes
from scaler.simulator.offline import Simulation

HOLDING_GB = 1e6  # GB·s one second of waiting is worth while holding: every hold is worth its memory


class SwitchingLedger(Ledger):
    """Decides with `holding` from `from_ms` of the run on, with the policy it is given before."""

    def __init__(self, from_ms: int, holding: Policy) -> None:
        super().__init__()
        self.from_ms, self.holding = from_ms, holding

    def decide(self, cmd: AnyCommand, now: int, policy: Policy):
        return super().decide(cmd, now, self.holding if now >= self.from_ms else policy)


def score(dataset, policy: Policy, ledger: Ledger | None = None) -> float:
    return Simulation(dataset, policy, ledger=ledger or Ledger()).run().stats().score


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(6)))
    p.add_argument("--from-minutes", nargs="+", type=float, default=[0, 3, 6])
    p.add_argument("--trace", default="burst", choices=shapes.TRACES)
    args = p.parse_args()
    holding = Learned(LearnedConfig(exchange_rate=HOLDING_GB))  # its exchange rate fixed, not the run's
    switched = [f"holding from min {m:g}" for m in args.from_minutes]
    print(f"| gen-{args.trace} seed | learned | {' | '.join(switched)} | histogram |")
    print("|---:|---:|" + "---:|" * len(switched) + "---:|")
    for seed in args.seeds:
        dataset = shapes.generate(args.trace, seed)
        cells = [score(dataset, get_policy("learned"))]
        for minutes in args.from_minutes:
            ledger = SwitchingLedger(int(minutes * 60_000), holding)
            cells.append(score(dataset, get_policy("learned"), ledger))
        cells.append(score(dataset, get_policy("histogram")))
        print(f"| {seed} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
