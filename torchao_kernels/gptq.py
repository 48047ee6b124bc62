"""method="gptq": rounding with error feedback through the inputs' second moment.

The search (quant.py) rounds every weight on its own. What a layer adds to the
model's error is not the weights' error but the outputs' one,
E||(W - Wq) x||^2 = sum_r (w_r - q_r) H (w_r - q_r)^T with H = E[x x^T], the
inputs' second moment that torchao_kernels.calibrate records. Its
off-diagonal terms let a later input channel make up for the rounding of an
earlier one (the optimal-brain-surgeon update used by GPTQ): the channels are
rounded in order, and after each one the rounding error is spread over the
channels not yet rounded, in proportion to the row of the Cholesky factor of
H^-1 (dampened by a small multiple of its mean diagonal).

What this implementation keeps from the rest of the package:

- the output is the same (qvals, scales, zero points) the ops take, same
  bits, group size and bytes, computed under the kernels' dequantization
  scale * (q - zero) with every scale as stored (float32 or bfloat16);
- each group's scale and integer zero point come from the search, run on the
  group's weights as they are when the group starts (after the error of the
  groups before it was spread onto them), weighted per channel by the
  inverse of H^-1's Cholesky diagonal (the cost of an error in that channel
  once the channels after it have compensated);
- rows are independent (each has its own scales), so every row keeps the
  candidate with the smallest output error (w - q) H (w - q)^T among this
  method, the search weighted by the diagonal of H (the "calibrated" search)
  and round to nearest: never worse than either, row by row, in the metric
  that counts.

Channels are rounded in their natural order (no activation ordering), so the
groups stay contiguous as the packed format needs.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["gptq_quantize", "output_error", "DAMP"]

# Dampening added to H's diagonal, as a fraction of its mean diagonal: enough
# for a Cholesky factor on real layers whose inputs have near-dead channels.
DAMP = 0.01
# Groups whose scales are searched together, from the weights as the groups
# before them left them: 1 searches each group when it starts; more amortize
# the search's fixed cost (None: every group up front, from the float weights).
SEARCH_GROUPS = 4
# Rows per worker thread before the rows are split over threads.
ROWS_PER_WORKER = 8192


def output_error(w: torch.Tensor, wq: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Per row r: (w_r - wq_r) H (w_r - wq_r)^T, the expected squared output
    error of the row for inputs whose second moment is H (float64 sums of a
    float32 product: a float64 product cost seconds on an output head and
    only moves candidates that tie to float32 precision)."""
    d = w.to(torch.float32) - wq.to(torch.float32)
    return ((d @ h.to(torch.float32)) * d).sum(-1, dtype=torch.float64)


def _inverse_factor(h: torch.Tensor, damp: float) -> Optional[torch.Tensor]:
    """Upper Cholesky factor U of (H + damp * mean(diag H) * I)^-1 (float64),
    with U^T U = that inverse; None when H has no positive diagonal or is not
    finite, or when the inverse does not factor even with 10^8 times the
    dampening. More dampening until the inverse factors.

    Raises ValueError when H + DAMP * mean(diag H) * I (at least) has no
    Cholesky factor: H then has an eigenvalue below about -DAMP * mean(diag H),
    far beyond the rounding of a sum of float products x x^T (whose smallest
    eigenvalue is >= 0 up to a few ulps of the largest, at most k * mean(diag H)),
    so it is not a second moment. A positive semi-definite H, singular or
    ill-conditioned, always factors: the dampening bounds its eigenvalues
    below by DAMP * mean(diag H), and the Cholesky factorization in float64
    only fails below about k * 1e-16 times the largest (k^2 * 1e-16 * mean)."""
    h = h.to(torch.float64)
    k = h.shape[0]
    diag = torch.diagonal(h)
    mean = float(diag.mean())
    if not mean > 0 or not torch.isfinite(h).all():
        return None
    eye = torch.eye(k, dtype=torch.float64)
    # channels that never fired: their weights cost nothing; a unit diagonal keeps H invertible
    dead = torch.diag(diag <= 0)

    def factor(damp):
        l, info = torch.linalg.cholesky_ex(torch.where(dead, eye * mean, h + (damp * mean) * eye))
        return l if int(info) == 0 else None

    l = factor(damp)
    if l is None and damp < DAMP:
        damp = DAMP
        l = factor(damp)
    if l is None:
        raise ValueError(f"hessian must be positive semi-definite (an input second moment E[x x^T]): hessian + "
                         f"{damp:g} * mean(diag(hessian)) * I has no Cholesky factor (an eigenvalue below about "
                         f"-{damp:g} * mean(diag(hessian)))")
    for _ in range(8):
        u, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(l), upper=True)
        if int(info) == 0:
            return u
        damp *= 10
        l = factor(damp)
        if l is None:
            break
    return None


def gptq_quantize(wg: torch.Tensor, h: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype,
                  damp: float = DAMP, search_groups: Optional[int] = SEARCH_GROUPS
                  ) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """wg (n, groups, gs) float32, h (k, k) symmetric: (q, scale, zero) float32
    with shapes (n, groups, gs), (n, groups), (n, groups), or None when H cannot
    be used (no positive diagonal, not finite). ValueError when H is clearly not
    positive semi-definite (see _inverse_factor)."""
    n = wg.shape[0]
    u = _inverse_factor(h, damp)
    if u is None:
        return None
    u = u.to(torch.float32)
    threads = torch.get_num_threads()
    # Rows are independent: chunks of rows on worker threads, one intra-op
    # thread each (the loop's ops are small; see quant._search). Only for tall
    # layers: two Python threads each issuing a few hundred-microsecond ops per
    # channel mostly wait for the interpreter lock, which on a busy machine made
    # 2 workers several times slower than 1 on MiniLM-sized layers.
    workers = max(1, min(threads, n // ROWS_PER_WORKER))
    if workers == 1:
        old = threads
        torch.set_num_threads(1)
        try:
            return _rows(wg, u, bits, has_zeros, scale_dtype, search_groups)
        finally:
            torch.set_num_threads(old)
    from concurrent.futures import ThreadPoolExecutor

    bounds = [n * i // workers for i in range(workers + 1)]

    def run(i):
        torch.set_num_threads(1)
        return _rows(wg[bounds[i]:bounds[i + 1]], u, bits, has_zeros, scale_dtype, search_groups)

    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(run, range(workers)))
    finally:
        torch.set_num_threads(threads)
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


def _rows(wg: torch.Tensor, u: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype,
          search_groups: Optional[int]):
    """The error-feedback rounding of rows wg (n, groups, gs) with U (k, k)."""
    from .quant import _search_chunk

    n, groups, gs = wg.shape
    k = groups * gs
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    # Channels as rows (k, n): each step of the loop reads and updates whole
    # contiguous rows instead of a column strided by k, which on a tall layer
    # (an output head of 49152 rows) touched one cache line per weight.
    wt = wg.reshape(n, k).t().contiguous()
    qt = torch.empty(k, n)
    s_out = torch.empty(n, groups)
    z_out = torch.empty(n, groups)
    d = torch.diagonal(u)
    cost = (1.0 / (d * d)).reshape(1, groups, gs)   # the price of an error in each channel
    span = groups if search_groups is None else max(1, int(search_groups))
    s_all = z_all = None
    err = torch.empty(gs, n)
    for g in range(groups):
        c0, c1 = g * gs, (g + 1) * gs
        if g % span == 0:
            # the next groups as the earlier ones left them
            g1 = min(groups, g + span)
            x = wt[c0:g1 * gs].t().contiguous().reshape(n, g1 - g, gs)
            _, s_all, z_all = _search_chunk(x, bits, has_zeros, scale_dtype, cost[:, g:g1])
            first = g
        s, z = s_all[:, g - first], z_all[:, g - first]
        s_out[:, g], z_out[:, g] = s, z
        block = wt[c0:c1]
        inv = 1.0 / s
        ublk = u[c0:c1, c0:c1]
        dinv = 1.0 / torch.diagonal(ublk)
        col = torch.empty(n)
        for j in range(gs):
            # channel j as the channels before it in the group left it (a read
            # of their errors: cheaper than updating every later channel after
            # each one)
            if j:
                torch.addmv(block[j], err[:j].t(), ublk[:j, j], alpha=-1.0, out=col)
            else:
                col.copy_(block[j])
            qj = qt[c0 + j]
            torch.mul(col, inv, out=qj)
            qj.round_().add_(z).clamp_(qmin, qmax)
            e = err[j]
            torch.sub(qj, z, out=e)
            e.mul_(s).neg_().add_(col).mul_(dinv[j])
        if c1 < k:
            wt[c1:].addmm_(u[c0:c1, c1:].t(), err, alpha=-1.0)
    return qt.t().contiguous().reshape(n, groups, gs), s_out, z_out
