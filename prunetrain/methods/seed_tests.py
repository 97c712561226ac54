"""Tests across seeds: is one setting ahead of another beyond the spread between seeds?

Each seed trains both settings once, so the scores pair up seed by seed; the test looks at the per-seed differences
d_s = score(arm, seed s) − score(reference, seed s), s = 1…n (the corpus-level noise within a seed is the paired
bootstrap's subject, `prunetrain.methods.significance`). Two tests of the null hypothesis "no difference":

- **paired t-test** (Student 1908): with d̄ the mean and s_d the sample standard deviation (n − 1) of the d_s,

      t = d̄ / (s_d / √n),   df = n − 1,   p = P(|T_df| ≥ |t|) = I_{df / (df + t²)}(df / 2, 1 / 2),

  the two-sided tail of Student's t distribution through the regularized incomplete beta function I_x(a, b),
  computed by its continued fraction (Numerical Recipes, 3rd ed., §6.4; modified Lentz's method). It assumes the
  differences are normal, which a few seeds cannot check.
- **exact sign-flip permutation test** (Fisher 1935): under the null hypothesis each d_s is as likely to have the
  other sign, so all 2^n sign vectors ε ∈ {−1, +1}^n are enumerated and

      p = #{ε : |mean(ε_s · d_s)| ≥ |d̄|} / 2^n

  (a small tolerance counts float ties as ties). No distribution is assumed, but the observed vector and its negation
  always count, so the smallest p it can give is 2 / 2^n: 0.0625 with 5 seeds, never below 0.05.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

MAX_SIGN_FLIP_SEEDS = 24
"""The sign-flip test enumerates 2^n sign vectors; beyond this many differences it is refused."""


def _beta_continued_fraction(x: float, a: float, b: float, *, steps: int = 300, eps: float = 1e-15) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes `betacf`), evaluated by modified Lentz's method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, steps + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b) for 0 ≤ x ≤ 1 and a, b > 0 (the continued fraction where it converges fast,
    else through I_x(a, b) = 1 − I_{1−x}(b, a))."""
    if not (a > 0 and b > 0) or not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_incomplete_beta: needs 0 <= x <= 1 and a, b > 0, got x={x}, a={a}, b={b}.")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(1.0 - x, b, a) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with `df` degrees of freedom: I_{df / (df + t²)}(df / 2, 1 / 2)."""
    if not df > 0 or math.isnan(t):
        raise ValueError(f"t_two_sided_p: needs a number t and df > 0, got t={t}, df={df}.")
    if math.isinf(t):
        return 0.0
    return min(1.0, regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5))


def paired_t_test(differences: Sequence[float]) -> dict:
    """{"n", "mean", "sd", "t", "df", "p_value"} of the paired t-test on the per-seed differences (the module
    docstring's equation). With fewer than two differences, or differences all equal (s_d = 0, t undefined), "t" and
    "p_value" are None and "why" says so."""
    d = [float(v) for v in differences]
    n = len(d)
    out = {"n": n, "mean": statistics.fmean(d) if d else None, "sd": statistics.stdev(d) if n > 1 else None,
           "t": None, "df": n - 1 if n > 1 else None, "p_value": None}
    if n < 2:
        return dict(out, why=f"{n} paired seed{'s' if n != 1 else ''}; a t-test needs at least 2")
    if out["sd"] <= 1e-12 * max(1.0, abs(out["mean"])):
        return dict(out, why="every seed gives the same difference (sd 0): t is undefined")
    out["t"] = out["mean"] / (out["sd"] / math.sqrt(n))
    out["p_value"] = t_two_sided_p(out["t"], n - 1)
    return out


def sign_flip_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of the exact sign-flip permutation test (the module docstring's count over all 2^n sign vectors);
    None without differences."""
    d = np.asarray(differences, dtype=np.float64)
    n = len(d)
    if n == 0:
        return None
    if n > MAX_SIGN_FLIP_SEEDS:
        raise ValueError(f"sign_flip_p: {n} differences would need 2^{n} sign vectors; at most "
                         f"{MAX_SIGN_FLIP_SEEDS} are enumerated.")
    observed = abs(d.mean())
    tolerance = 1e-9 * (1.0 + float(np.abs(d).max()))
    bits = np.arange(n)
    extreme = 0
    chunk = 1 << 16
    for start in range(0, 1 << n, chunk):  # the sign vectors in chunks: at most 65536 × n numbers at once
        codes = np.arange(start, min(start + chunk, 1 << n))
        signs = 1.0 - 2.0 * ((codes[:, None] >> bits) & 1)
        extreme += int((np.abs(signs @ d) / n >= observed - tolerance).sum())
    return extreme / float(1 << n)


def smallest_sign_flip_p(n: int) -> float | None:
    """The smallest two-sided p the sign-flip test can give with n differences: 2 / 2^n (the observed sign vector
    and its negation always count); None for n = 0."""
    return 2.0 / 2.0 ** n if n > 0 else None


__all__ = ["MAX_SIGN_FLIP_SEEDS", "paired_t_test", "regularized_incomplete_beta", "sign_flip_p",
           "smallest_sign_flip_p", "t_two_sided_p"]
