"""Float weights -> groupwise b-bit qvals, scales and zero points.

Three methods produce the tensors the ops take (qvals, scales, zero points):

- "rtn": round to nearest on each group's min/max range (the range includes 0,
  so the zero point stays in the bit range).
- "search" (default): per group, a search over the scale and, with zero points,
  the integer zero point the kernel stores, minimizing the (optionally
  importance-weighted) squared error of the dequantized weight exactly as the
  kernels compute it, scale * (q - zero), with the scale as stored (rounded to
  bfloat16 when scale_dtype is bfloat16). Each group keeps round-to-nearest's
  result unless the search found a strictly smaller error.
- "gptq": needs the layer's input second moment H (torchao_kernels.calibrate);
  rounds the input channels in order and spreads each rounding error over the
  channels not yet rounded, each group's scale and zero point searched when
  the group starts; per row, the smallest output error (w - q) H (w - q)^T of
  it, the search weighted by H's diagonal and round to nearest (gptq.py).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._format_limits import GROUP_MULTIPLE, MAX_BITS

__all__ = ["quantize_weight", "dequantize_weight", "weight_error", "METHODS"]

METHODS = ("search", "rtn", "gptq")

# The search's candidates. Coarse: fractions of the group's range the largest
# step may span (clipping below 1). Fine: relative steps around the best
# coarse scale. The grids were chosen on Gaussian and real (SmolLM2, MiniLM)
# weights: more points change the error by well under 1%.
_COARSE = (0.50, 0.58, 0.65, 0.71, 0.76, 0.80, 0.84, 0.87, 0.90, 0.925, 0.95, 0.97, 0.985, 1.0, 1.02)
_FINE = (-0.03, -0.02, -0.01, -0.005, 0.005, 0.01, 0.02, 0.03)
_REFITS = 2
# Elements per chunk of rows: the candidates loop over a chunk that stays in
# cache (a few MB), instead of materialising every candidate of a whole layer.
_CHUNK = 1 << 19


def check_bits(bits) -> None:
    """bits must be a weight bit width the kernels take (an int, not a bool)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an int in 1..{MAX_BITS}, got {bits!r}")


def is_group_size(g) -> bool:
    """Whether g is a positive int multiple of GROUP_MULTIPLE (not a bool); whether
    it divides k, and the per-channel spellings, are for the caller."""
    return not isinstance(g, bool) and isinstance(g, int) and g >= GROUP_MULTIPLE and g % GROUP_MULTIPLE == 0


def _check(w: torch.Tensor, bits: int, group_size: int) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating point tensor (n, k), got {getattr(w, 'shape', type(w))}")
    if w.device.type != "cpu":
        raise ValueError(f"w is on the {w.device.type} device; quantizing reads its values on the CPU "
                         "(a model built on the meta device needs its weights loaded first)")
    check_bits(bits)
    k = w.shape[1]
    if not is_group_size(group_size) or k % group_size:
        raise ValueError(
            f"group_size must be a multiple of {GROUP_MULTIPLE} that divides k={k}, got {group_size!r}"
        )
    finite = torch.isfinite(w)
    if not bool(finite.all()):
        r, c = (int(i) for i in (~finite).nonzero()[0])
        raise ValueError(f"w must be finite: w[{r}, {c}] = {float(w[r, c])} (a quantized weight has a finite "
                         "scale and an integer value)")


def _check_importance(importance: Optional[torch.Tensor], k: int) -> Optional[torch.Tensor]:
    if importance is None:
        return None
    if not isinstance(importance, torch.Tensor) or importance.shape != (k,) or not importance.is_floating_point():
        raise ValueError(
            f"importance must be a float tensor of shape (k,) = ({k},), one weight per input channel, "
            f"got {getattr(importance, 'shape', type(importance))}"
        )
    a = importance.detach().to(torch.float32)
    if not torch.isfinite(a).all() or (a < 0).any():
        raise ValueError("importance must be finite and >= 0 (e.g. the mean squared activation per input channel)")
    return _to_unit_scale(a, float(a.to(torch.float64).mean()))


def _to_unit_scale(t: torch.Tensor, level: float) -> torch.Tensor:
    """t times the power of four 4^-j that brings level (t's size: the mean of
    importance, the mean diagonal of H) into [0.5, 2); t itself when level is
    there already or is not positive (an all-zero t).

    Only the relative sizes of importance and H matter, but the float32 sums
    the methods form overflow or underflow far from 1 (importance 1e20 or
    1e-30 scored every candidate inf or 0, and every group kept round to
    nearest). A power of two scales every product, sum and quotient of the
    search and of the output error without rounding, and a power of four also
    the square roots of H's Cholesky factors: the results for t and for
    t * 4^i are bit for bit the same, and the same as before this
    normalisation for any t whose sums did not overflow or underflow.
    """
    if not (level > 0 and math.isfinite(level)):
        return t
    p = 2 * (math.frexp(level)[1] // 2)   # level = f * 2^e, f in [0.5, 1): 2^(e - p) * f in [0.5, 2)
    while p:
        step = max(-100, min(100, p))      # 2^-step stays a normal float32
        t = t * (2.0 ** -step)
        p -= step
    return t


def _weights(imp: Optional[torch.Tensor], groups: int, gs: int) -> Optional[torch.Tensor]:
    """The search's per-channel weights (1, groups, gs), None (unweighted) for
    a uniform positive importance, which weights every candidate alike."""
    if imp is None or (bool((imp == imp[0]).all()) and float(imp[0]) > 0):
        return None
    return imp.reshape(1, groups, gs)


def quantize_weight(
    w: torch.Tensor, bits: int = 4, group_size: Optional[int] = 32, has_zeros: bool = False,
    scale_dtype: Optional[torch.dtype] = None, *, method: str = "search",
    importance: Optional[torch.Tensor] = None, hessian: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Quantizes a float weight (n, k) groupwise to `bits` bits.

    Returns (qvals int8 (n, k) in [-2^(bits-1), 2^(bits-1)-1], scales
    (n, k / group_size), zeros int8 (n, k / group_size) or None); the kernels
    compute with scale * (qvals - zero). group_size None or -1 means per
    channel (one group of k). 1- and 2-bit weights need has_zeros=True to be
    useful.

    method: "search" (default) searches each group's scale and, with zero
      points, its integer zero point for the smallest squared error of the
      weights as the kernels dequantize them, never worse than "rtn" for any
      group. Its scales may be negative without zero points (the larger side
      of the bit range then holds the largest weight) and its zero points may
      lie anywhere in int8 (a group whose weights do not straddle 0 is not
      forced to include it).
      "rtn": round to nearest, symmetric without zero points (scale =
      max|w| / ((2^bits - 1) / 2)) and asymmetric with them, over a range that
      includes 0 so the zero point stays in the bit range.
    importance: optional float tensor (k,), >= 0: how much an error in each
      input channel costs (e.g. the mean squared activation of that channel,
      see torchao_kernels.calibrate); the search minimizes
      sum_i importance_i * (w_i - dequantized_i)^2. "search" and "gptq"
      (where it weights the search candidate; default: H's diagonal).
      "gptq": rounding with error feedback through hessian, each group's
      scale and zero point searched when the group starts, and per row the
      result with the smallest output error (w - q) H (w - q)^T among it, the
      search weighted by importance and round to nearest (see gptq.py).
    hessian: float tensor (k, k), symmetric positive semi-definite: the
      layer's input second moment E[x x^T] (Calibration.hessian); "gptq" only.
      ValueError when it is not symmetric beyond rounding (|H_ij - H_ji| more
      than 1e-3 of sqrt(H_ii H_jj), more for a half-precision H; smaller
      differences are averaged) or
      clearly not positive semi-definite (a negative diagonal, an
      |H_ij| > sqrt(H_ii H_jj), or no Cholesky factor of H + 0.01 *
      mean(diag H) * I). Singular H (channels that never fired, fewer inputs
      than channels) are fine.
    Only the relative sizes of importance and hessian matter: each is scaled by
      a power of four to a mean (diagonal) near 1 before use, so importance * c
      and hessian * c give bit for bit the same result as importance and
      hessian for c = 4^i (while the scaled values stay normal floats), and for
      other c the same but for the rounding of the scaled input (which moves
      near-ties, as c = 3 does at any scale); a uniform positive importance is the
      unweighted search, an all-zero one keeps round to nearest.
    scale_dtype: torch.float32 or torch.bfloat16; None (default) picks
      bfloat16 for a bfloat16 weight and float32 otherwise, as torchao does.
      With bfloat16 each scale is rounded to bfloat16 before the weights are
      quantized with it, and the scales are returned as a bfloat16 tensor, which
      pack() stores in 2 bytes instead of 4 (less to read per call: ~10% at 4
      bits, group 32).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in METHODS)}, got {method!r}")
    if scale_dtype is None:
        scale_dtype = torch.bfloat16 if isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 else torch.float32
    if scale_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"scale_dtype must be torch.float32 or torch.bfloat16, got {scale_dtype}")
    if group_size is None or group_size == -1:
        group_size = w.shape[1] if isinstance(w, torch.Tensor) and w.dim() == 2 else group_size
    _check(w, bits, group_size)
    n, k = w.shape
    imp = _check_importance(importance, k)
    if imp is not None and method == "rtn":
        raise ValueError("importance weights the search's error; method='rtn' does not use them")
    h = _check_hessian(hessian, k, method)
    wg = w.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    if method == "rtn":
        q, scale, zero = _rtn(wg, bits, has_zeros, scale_dtype)
    elif method == "gptq":
        q, scale, zero = _gptq(wg, bits, has_zeros, scale_dtype, h, imp)
    else:
        q, scale, zero = _search(wg, bits, has_zeros, scale_dtype, _weights(imp, k // group_size, group_size))
    zeros = zero.to(torch.int8) if has_zeros else None
    scale = scale.to(scale_dtype).contiguous()
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        r, g = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"the weights of row {r}, group {g} span more than a {scale_dtype} scale can "
                         f"express (largest |w| there: {float(wg[r, g].abs().max())})")
    return q.to(torch.int8).reshape(n, k), scale, zeros


def _check_hessian(hessian: Optional[torch.Tensor], k: int, method: str) -> Optional[torch.Tensor]:
    """hessian checked (finite, symmetric, no 2 x 2 principal minor negative),
    symmetrised and scaled by a power of four to a mean diagonal in [0.5, 2)
    (_to_unit_scale); float32 or float64. The rest of positive
    semi-definiteness is checked by its Cholesky factor (gptq._inverse_factor)."""
    if hessian is None:
        if method == "gptq":
            raise ValueError("method='gptq' needs hessian=, the layer's input second moment (k, k) "
                             "(torchao_kernels.calibrate records it: Calibration.hessian(name))")
        return None
    if method != "gptq":
        raise ValueError(f"hessian is used by method='gptq' only, not method={method!r}")
    if not isinstance(hessian, torch.Tensor) or hessian.shape != (k, k) or not hessian.is_floating_point():
        raise ValueError(f"hessian must be a float tensor of shape (k, k) = ({k}, {k}), the layer's input "
                         f"second moment, got {getattr(hessian, 'shape', type(hessian))}")
    h = hessian.detach()
    if not torch.isfinite(h).all() or (torch.diagonal(h) < 0).any():
        raise ValueError("hessian must be finite with a diagonal >= 0 (an input second moment E[x x^T])")
    if h.dtype not in (torch.float32, torch.float64):
        h = h.to(torch.float32)
    h = _to_unit_scale(h, float(torch.diagonal(h).to(torch.float64).mean()))
    # Sums of float products are symmetric up to rounding, which is at most a
    # few ulps of sum_r |x_ri x_rj| <= rows * sqrt(H_ii H_jj) (Cauchy-Schwarz):
    # differences within rtol of sqrt(H_ii H_jj) are averaged away, larger ones
    # are an error. The same bound is the 2 x 2 minors' condition of positive
    # semi-definiteness, |H_ij| <= sqrt(H_ii H_jj), which also covers what the
    # Cholesky factor cannot see: the rows of channels that never fired
    # (H_ii = 0), which gptq.py replaces by unit rows.
    rtol = max(1e-3, 8 * torch.finfo(hessian.dtype).eps)
    diag = torch.diagonal(h)
    atol = 1e-6 * float(diag.to(torch.float64).mean())
    root = diag.sqrt()
    symmetric = True
    tile = 512
    # tiles (i, j) and (j, i) of the upper triangle: contiguous reads of both
    for i0 in range(0, k, tile):
        for j0 in range(i0, k, tile):
            a, b = h[i0:i0 + tile, j0:j0 + tile], h[j0:j0 + tile, i0:i0 + tile].t()
            bound = root[i0:i0 + tile, None] * root[None, j0:j0 + tile]
            diff = (a - b).abs()
            bad = diff > rtol * bound + atol
            if not bool(bad.any()):
                symmetric = symmetric and bool((diff == 0).all())
                bad = (0.5 * (a + b)).abs() > (1 + rtol) * bound + atol
                if not bool(bad.any()):
                    continue
                i, j = (int(v) for v in bad.nonzero()[0])
                i, j = i + i0, j + j0
                raise ValueError(
                    f"hessian must be positive semi-definite (an input second moment E[x x^T]): |hessian[{i}, {j}]| "
                    f"= {abs(float(hessian[i, j])):.6g} exceeds sqrt(hessian[{i}, {i}] * hessian[{j}, {j}]) = "
                    f"{math.sqrt(float(hessian[i, i]) * float(hessian[j, j])):.6g}")
            i, j = (int(v) for v in bad.nonzero()[0])
            i, j = i + i0, j + j0
            raise ValueError(f"hessian must be symmetric (an input second moment E[x x^T]): hessian[{i}, {j}] = "
                             f"{float(hessian[i, j]):.6g} but hessian[{j}, {i}] = {float(hessian[j, i]):.6g}")
    if not symmetric:
        h = 0.5 * (h + h.t())
    return h


def _gptq(wg: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype, h: torch.Tensor,
          imp: Optional[torch.Tensor]):
    """method="gptq" on (rows, groups, gs): per row, the best of the error-feedback
    rounding, the search weighted by imp (default H's diagonal) and round to nearest."""
    from .gptq import gptq_quantize, output_error

    n, groups, gs = wg.shape
    k = groups * gs
    # first: it checks the rest of H's positive semi-definiteness
    g = gptq_quantize(wg, h, bits, has_zeros, scale_dtype)
    diag = torch.diagonal(h).to(torch.float32)
    if imp is None:
        mean = float(diag.mean())
        imp = diag + 1e-3 * mean if mean > 0 else None
    a = _weights(imp, groups, gs)
    cands = [_rtn(wg, bits, has_zeros, scale_dtype), _search(wg, bits, has_zeros, scale_dtype, a)]
    if g is not None:
        cands.append(g)
    w = wg.reshape(n, k)
    best_q, best_s, best_z = cands[0]
    best_e = output_error(w, (best_s.unsqueeze(-1) * (best_q - best_z.unsqueeze(-1))).reshape(n, k), h)
    for q, s, z in cands[1:]:
        e = output_error(w, (s.unsqueeze(-1) * (q - z.unsqueeze(-1))).reshape(n, k), h)
        better = e < best_e                         # ties keep the earlier (simpler) candidate
        best_q = torch.where(better[:, None, None], q, best_q)
        best_s = torch.where(better[:, None], s, best_s)
        best_z = torch.where(better[:, None], z, best_z)
        best_e = torch.where(better, e, best_e)
    return best_q, best_s, best_z


def _rtn(wg: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype):
    """Round to nearest on (rows, groups, group_size): (q, scale, zero) as float32."""
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    tiny = torch.finfo(torch.float32).tiny
    if has_zeros:
        lo = wg.amin(-1).clamp(max=0.0)
        hi = wg.amax(-1).clamp(min=0.0)
        scale = _round_scale(((hi - lo) / float(qmax - qmin)).clamp(min=tiny), scale_dtype)
        zero = (qmin - torch.round(lo / scale)).clamp(qmin, qmax)
        q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)) + zero.unsqueeze(-1), qmin, qmax)
    else:
        amax = wg.abs().amax(-1)
        scale = _round_scale((amax / ((qmax - qmin) / 2.0)).clamp(min=tiny), scale_dtype)
        q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)), qmin, qmax)
        zero = torch.zeros_like(scale)
    return q, scale, zero


def _round_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """The float32 scales as they will be stored (bfloat16: rounded to nearest,
    kept at least as large as the smallest positive bfloat16 normal)."""
    if scale_dtype == torch.float32:
        return scale
    tiny = torch.finfo(torch.bfloat16).tiny
    return scale.to(torch.bfloat16).float().clamp(min=tiny)


def _store_signed(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """Like _round_scale for scales of either sign: magnitude at least the
    dtype's smallest normal (so 1 / scale stays finite), sign kept."""
    if scale_dtype == torch.bfloat16:
        scale = scale.to(torch.bfloat16).float()
    tiny = torch.finfo(scale_dtype).tiny
    return torch.where(scale < 0, scale.clamp(max=-tiny), scale.clamp(min=tiny))


def _err(x, a, q, scale, zero):
    """Weighted squared error per group of x (rows, groups, gs) against scale * (q - zero)."""
    d = x - scale.unsqueeze(-1) * (q - zero.unsqueeze(-1))
    d = d * d
    return (d if a is None else d * a).sum(-1)


def weight_error(w: torch.Tensor, qvals: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                 group_size: int, importance: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Squared error per (row, group) of w against the dequantized weight,
    weighted per input channel by importance (k,) when given."""
    n, k = w.shape
    x = w.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    q = qvals.to(torch.float32).reshape(n, k // group_size, group_size)
    z = torch.zeros(n, k // group_size) if zeros is None else zeros.to(torch.float32)
    a = None if importance is None else importance.to(torch.float32).reshape(1, k // group_size, group_size)
    return _err(x, a, q, scales.to(torch.float32), z)


def _search(wg: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype, a: Optional[torch.Tensor]):
    n, groups, gs = wg.shape
    q_out = torch.empty_like(wg)
    s_out = torch.empty(n, groups)
    z_out = torch.empty(n, groups)
    threads = torch.get_num_threads()
    # at most _CHUNK elements per chunk, and at least one chunk per thread
    rows = max(1, min(_CHUNK // (groups * gs), -(-n // threads)))
    starts = list(range(0, n, rows))

    def run(r0):
        q, s, z = _search_chunk(wg[r0:r0 + rows], bits, has_zeros, scale_dtype, a)
        q_out[r0:r0 + rows], s_out[r0:r0 + rows], z_out[r0:r0 + rows] = q, s, z

    workers = min(torch.get_num_threads(), len(starts))
    if workers <= 1:
        for r0 in starts:
            run(r0)
        return q_out, s_out, z_out
    # The chunks' ops are small (a few hundred microseconds): one thread per op
    # and the chunks spread over worker threads (torch releases the GIL inside
    # ops) scales as well as intra-op threads on an idle machine, and does not
    # collapse on a busy one, where intra-op threads wait at every op's barrier
    # for a thread the OS has descheduled.
    from concurrent.futures import ThreadPoolExecutor

    torch.set_num_threads(1)
    # grad and inference mode are per thread: the workers take the caller's
    # (outputs made under inference_mode can only be written inside it)
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
    try:
        def run_alone(r0):
            torch.set_num_threads(1)  # this worker's own setting too
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                run(r0)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run_alone, starts))
    finally:
        torch.set_num_threads(threads)
    return q_out, s_out, z_out


def _search_chunk(x: torch.Tensor, bits: int, has_zeros: bool, scale_dtype: torch.dtype,
                  a: Optional[torch.Tensor]):
    """The search on one chunk of rows x (rows, groups, gs).

    For a candidate scale s (and zero point z) the best qvals are
    clamp(round(x / s) + z): each weight independently. For those qvals, with
    z fixed, the best real scale is the least-squares one,
    s* = sum(a x u) / sum(a u^2) with u = q - z, and the error it leaves is
    sum(a x^2) - sum(a x u)^2 / sum(a u^2); so a candidate is scored by
    sum(a x u)^2 / sum(a u^2) (larger is better) without forming its error.
    Candidates: a coarse grid of clipping ratios (both signs of the scale
    without zero points), then a fine grid around the best with z - 1, z,
    z + 1, then rounds of re-rounding with the refitted scale. The winner's
    scale is rounded as stored, its qvals recomputed with that scale and its
    exact error compared with round to nearest's, group by group.
    """
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    nlev = qmax - qmin
    ax = x if a is None else x * a
    state = _Best(x.shape[:-1])

    def consider(s, z):
        """Scores scale s and zero point z (rows, groups) and keeps the better."""
        inv = (1.0 / s).unsqueeze(-1)
        u = x * inv
        u.round_()
        if has_zeros:
            u = torch.clamp(u, (qmin - z).unsqueeze(-1), (qmax - z).unsqueeze(-1))
        else:
            u.clamp_(qmin, qmax)
        sxu = torch.linalg.vecdot(ax, u)
        suu = torch.linalg.vecdot(u if a is None else u * a, u)
        ok = suu > 0
        score = torch.where(ok, sxu * sxu / torch.where(ok, suu, 1.0), 0.0)
        s_ls = torch.where(ok & (sxu != 0), sxu / torch.where(ok, suu, 1.0), s)
        state.update(score, s_ls, z)

    tiny = torch.finfo(torch.float32).tiny
    if has_zeros:
        lo, hi = x.amin(-1), x.amax(-1)
        span = (hi - lo).clamp(min=tiny)
        mid = 0.5 * (lo + hi)
        for f in _COARSE:
            s = span * (f / nlev)
            # the window of 2^bits levels centred on the group's range
            z = _zero_for(s, mid, qmin, nlev)
            consider(s, z)
    else:
        amax_i = x.abs().argmax(-1, keepdim=True)
        ext = x.gather(-1, amax_i).squeeze(-1)          # the signed largest weight
        mag = ext.abs().clamp(min=tiny)
        sign = torch.where(ext < 0, -1.0, 1.0)
        for f in _COARSE:
            # the largest weight on the longer side of the range (-2^(b-1)) ...
            consider(-sign * mag / ((-qmin + 0.5) * f), None)
            # ... or on the shorter one (2^(b-1) - 1), as round to nearest does
            if qmax > 0:
                consider(sign * mag / ((qmax + 0.5) * f), None)
    best_s, best_z = state.s.clone(), state.z
    for d in _FINE:
        s = best_s * (1.0 + d)
        if has_zeros:
            for dz in (-1.0, 0.0, 1.0):
                consider(s, (best_z + dz).clamp(-128, 127))
        else:
            consider(s, None)
    if has_zeros:
        consider(best_s, (best_z - 1).clamp(-128, 127))
        consider(best_s, (best_z + 1).clamp(-128, 127))
    for _ in range(_REFITS):
        consider(state.s.clone(), state.z)

    # the winner as stored, against round to nearest, group by group
    z = state.z if has_zeros else torch.zeros_like(state.s)
    s = _store_signed(state.s, scale_dtype)
    q = torch.clamp(torch.round(x / s.unsqueeze(-1)) + z.unsqueeze(-1), qmin, qmax)
    err = _err(x, a, q, s, z)
    q_r, s_r, z_r = _rtn(x, bits, has_zeros, scale_dtype)
    err_r = _err(x, a, q_r, s_r, z_r)
    better = err < err_r                           # NaN (degenerate groups) keeps round to nearest
    q = torch.where(better.unsqueeze(-1), q, q_r)
    return q, torch.where(better, s, s_r), torch.where(better, z, z_r)


def _zero_for(s, mid, qmin, nlev):
    """The int8 zero point whose window of levels is centred on mid at step s."""
    j0 = torch.round(mid / s - 0.5 * nlev)
    return (qmin - j0).clamp(-128, 127)


class _Best:
    """The best (score, least-squares scale, zero point) seen per group."""

    def __init__(self, shape):
        self.score = torch.full(shape, -1.0)
        self.s = torch.ones(shape)
        self.z = torch.zeros(shape)

    def update(self, score, s, z):
        better = score > self.score
        self.score = torch.where(better, score, self.score)
        self.s = torch.where(better, s, self.s)
        if z is not None:
            self.z = torch.where(better, z, self.z)


def dequantize_weight(
    qvals: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], group_size: int
) -> torch.Tensor:
    """float32 (n, k) weight = scale * (q - zero), groupwise."""
    if not isinstance(qvals, torch.Tensor) or qvals.dim() != 2:
        raise ValueError(f"qvals must be a 2-D tensor (n, k), got {getattr(qvals, 'shape', type(qvals))}")
    n, k = qvals.shape
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or k % group_size:
        raise ValueError(f"group_size must be a positive int that divides k={k}, got {group_size!r}")
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t is None and name == "zeros":
            continue
        if not isinstance(t, torch.Tensor) or t.numel() != n * (k // group_size) or \
                (t.dim() == 2 and tuple(t.shape) != (n, k // group_size)) or t.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape (n, k / group_size) = ({n}, {k // group_size}), got "
                             f"{tuple(getattr(t, 'shape', ())) if isinstance(t, torch.Tensor) else type(t)}")
    q = qvals.to(torch.float32).reshape(n, k // group_size, group_size)
    if zeros is not None:
        q = q - zeros.to(torch.float32).reshape(n, -1, 1)
    return (q * scales.reshape(n, -1, 1)).reshape(n, k)
