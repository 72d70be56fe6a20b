"""The two small estimators the engine's cost model fits with: non-negative least squares (the
verification and drafting costs in ms) and the per-position acceptance alpha that best explains
accepted tokens per draft at each measured draft length. Pure Python, a handful of unknowns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..domain import Config
from .formulas import expected_tokens_iid

ALPHA_MAX = 1.0 - 1e-9
RANK_TOLERANCE = 1e-3  # a column whose share not explained by the others is below this: not identified


def expected_accepted(alpha: float, gamma: int) -> float:
    """E[accepted | a draft of gamma tokens] = alpha (1 - alpha^gamma) / (1 - alpha): each drafted
    token accepted with probability alpha if every earlier one was (formulas.expected_tokens_iid
    less the target's own token)."""
    return expected_tokens_iid(min(max(alpha, 0.0), 1.0), gamma) - 1.0


def fit_alpha(points: Sequence[tuple[int, float, float]]) -> float:
    """The alpha minimising sum w (E[accepted | gamma] - accepted)^2 over (gamma, accepted per
    draft, weight) points; exact at a single gamma (E[accepted] grows with alpha). 0.0 without
    points."""
    points = [(g, min(max(a, 0.0), float(g)), w) for g, a, w in points if w > 0 and g > 0]
    if not points:
        return 0.0

    def loss(alpha: float) -> float:
        return sum(w * (expected_accepted(alpha, g) - a) ** 2 for g, a, w in points)

    grid = [ALPHA_MAX * i / 200 for i in range(201)]
    best = min(range(len(grid)), key=lambda i: loss(grid[i]))
    lo, hi = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    ratio = (5**0.5 - 1) / 2
    for _ in range(80):  # golden section inside the grid's bracket
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if loss(a) <= loss(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting on a small square system (a tiny ridge where
    singular)."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    scale = max((abs(a[i][i]) for i in range(n)), default=1.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-12 * scale:
            a[col][col] = 1e-12 * scale
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def _gram(columns: Sequence[Sequence[float]]) -> list[list[float]]:
    return [[sum(x * y for x, y in zip(a, b, strict=True)) for b in columns] for a in columns]


def identified(columns: Sequence[Sequence[float]]) -> list[bool]:
    """Per column: whether it carries information the earlier ones do not (its squared norm left
    after projecting out the earlier columns, as a share of its own, above RANK_TOLERANCE).
    A column of zeros is not identified."""
    kept: list[Sequence[float]] = []
    out = []
    for col in columns:
        norm = sum(x * x for x in col)
        if norm <= 0:
            out.append(False)
            continue
        if kept:
            g = _gram(kept)
            b = [sum(x * y for x, y in zip(k, col, strict=True)) for k in kept]
            coef = _solve(g, b)
            explained = sum(c * bi for c, bi in zip(coef, b, strict=True))
            ok = (norm - explained) / norm > RANK_TOLERANCE
        else:
            ok = True
        out.append(ok)
        if ok:
            kept.append(col)
    return out


def nnls(columns: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """x >= 0 minimising |sum_j x_j columns[j] - y|^2 (Lawson and Hanson's active set, on the
    normal equations: a few unknowns, many rows)."""
    n = len(columns)
    if n == 0:
        return []
    g = _gram(columns)
    b = [sum(x * t for x, t in zip(col, y, strict=True)) for col in columns]
    tol = 1e-10 * max(1.0, max(abs(v) for v in b))
    x = [0.0] * n
    passive: list[int] = []

    def solve_on(p: list[int]) -> list[float]:
        z = [0.0] * n
        sol = _solve([[g[i][j] for j in p] for i in p], [b[i] for i in p])
        for i, v in zip(p, sol, strict=True):
            z[i] = v
        return z

    for _ in range(3 * n + 3):
        w = [b[i] - sum(g[i][j] * x[j] for j in range(n)) for i in range(n)]
        free = [i for i in range(n) if i not in passive and w[i] > tol]
        if not free:
            break
        passive.append(max(free, key=lambda i: w[i]))
        z = solve_on(passive)
        while any(z[i] <= 0 for i in passive):
            step = min(x[i] / (x[i] - z[i]) if x[i] > z[i] else 0.0 for i in passive if z[i] <= 0)
            x = [xi + step * (zi - xi) for xi, zi in zip(x, z, strict=True)]
            passive = [i for i in passive if x[i] > 1e-15]
            z = solve_on(passive)
        x = z
    return [max(0.0, v) for v in x]


def ranked(
    configs: Iterable[Config], predict: Callable[[Config], float | None]
) -> list[tuple[Config, float]]:
    """(config, predict(config)), best first; configs it cannot predict are left out. Ties: the
    smaller gamma first (less drafting for the same rate)."""
    scored = [(c, predict(c)) for c in configs]
    out = [(c, s) for c, s in scored if s is not None]
    out.sort(key=lambda cs: (-cs[1], cs[0].gamma, cs[0].draft.name))
    return out
