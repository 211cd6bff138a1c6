"""Statistics for sampler tests: chi-square goodness of fit without scipy."""

import math
from collections import Counter
from collections.abc import Mapping

import numpy as np

# Every statistical check uses a fixed seed, so a pass is reproducible; the threshold only
# decides how unlikely a correct sampler's result may look before we call it wrong.
P_VALUE_FLOOR = 1e-3


def chi2_sf(stat: float, dof: int) -> float:
    """Chi-square survival function, Q(dof/2, stat/2) (Numerical Recipes 6.2: series below
    a + 1, Lentz continued fraction above). scipy is not a dependency of the project."""
    a, x = dof / 2, stat / 2
    if x <= 0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return 1 - total * math.exp(log_prefactor)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_prefactor) * h


def chi_square_p(draws: np.ndarray, expected: Mapping[int, float]) -> float:
    """p-value of draws (keys) against P(key) = expected[key]; a key outside ``expected``
    (or with probability 0) is an outright failure."""
    counts = Counter(draws.tolist())
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, "drew an impossible key"
    n = len(draws)
    probs = {k: p for k, p in expected.items() if p > 0}
    assert min(probs.values()) * n >= 5, "too few draws for the chi-square approximation"
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probs.items())
    return chi2_sf(stat, len(probs) - 1)


def normalised(weights: Mapping[int, float]) -> dict[int, float]:
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}
