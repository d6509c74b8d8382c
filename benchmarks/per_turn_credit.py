"""Per-turn credit against broadcasting on the synthetic two-turn task of tests/test_per_turn_credit.py.

Only one turn's choice earns a reward; the other turn's environment may pay a coin flip. Prints, over
seeds, the steps until the deciding turn's P(correct) stays >= 0.9, and how far the irrelevant turn
drifts from 0.5 when there is no coin. Run from the repository root: `python benchmarks/per_turn_credit.py`.
"""

import statistics
import sys

sys.path.insert(0, "tests")
from test_per_turn_credit import train_two_turns  # noqa: E402

for d, name in ((0, "first"), (1, "second")):
    for c in ("final", "per_turn"):
        r = [train_two_turns(c, d, 2.0, s, 80, group=4) for s in range(30)]
        print(f"{name}-turn decides, coin x2 at the other turn, group 4, 30 seeds, {c:8}: steps until P(correct) stays >= 0.9: mean {statistics.fmean(x[1] for x in r):.2f} max {max(x[1] for x in r)}")
    for c in ("final", "per_turn"):
        r = [train_two_turns(c, d, 0.0, s, 40) for s in range(20)]
        print(f"{name}-turn decides, no noise, group 8, 20 seeds, {c:8}: irrelevant turn mean |P-0.5| after 40 steps {statistics.fmean(abs(x[0][1-d]-0.5) for x in r):.4f}")
