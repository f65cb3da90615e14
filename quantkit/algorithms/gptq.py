"""GPTQ (Frantar et al., 2022): quantize a weight matrix column by column, spreading each column's
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the layer's
input. Pure functions; the Hessian is H = sum over calibration tokens of x x^T (any positive scale
gives the same result, because damping is relative to its mean diagonal).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from quantkit.algorithms import native as native_loops
from quantkit.algorithms.rtn import WeightScheme, grid_params, mse_grid_params, quantize_to_grid
from quantkit.formats.quantized import QuantizedWeight

MAX_DAMP = 1.0


@dataclass
class GPTQResult:
    weight: QuantizedWeight
    damp: float  # the damping fraction that made H positive definite
    rtn_fallback: bool  # True when no damping up to MAX_DAMP worked and plain rounding was used


# Hessian products: 128-row blocks of the upper triangle measured fastest in float32, 192-row blocks
# in bfloat16 (1 thread, Xeon with AMX, 512 tokens x 576 / 1536 wide).
BLOCK_ROWS = {torch.float32: 128, torch.bfloat16: 192}
# Tokens per product: the rows of several samples stacked into one taller product run 8-15% faster than a
# product per sample (1 thread, AMD Zen 4 with AVX-512 BF16, bfloat16, four 512-token samples per product
# against one), because each block of H is read and written once per stack instead of once per sample.
STACKED_ROWS = 2048


def input_hessian(inputs: list[torch.Tensor], token_weights: list[torch.Tensor] | None = None,
                  dtype: torch.dtype = torch.float32, block: int | None = None) -> torch.Tensor:
    """H = sum of x^T x over layer inputs, each [tokens, in] (padding rows removed first); with
    token_weights (one [tokens] tensor per input), sum of w_t x_t x_t^T. Always float32.

    H is symmetric, so only the blocks on and above the diagonal are multiplied and the lower triangle
    is mirrored at the end (near half the flops of a full product). dtype bfloat16 rounds the inputs
    and the products of each stack of samples (see STACKED_ROWS) to bfloat16 (relative error 2^-9 each,
    unbiased), summed in float32: far below the damping that GPTQ adds to H, and the same results over
    calibration draws (see docs/quantization.md)."""
    width = inputs[0].shape[-1]
    block = block or BLOCK_ROWS[dtype]
    hessian = torch.zeros(width, width)
    for x in _stacked_rows(inputs, token_weights, dtype):
        for start in range(0, width, block):
            hessian[start:start + block, start:] += x[:, start:start + block].T @ x[:, start:]
    return torch.triu(hessian) + torch.triu(hessian, diagonal=1).T


def _stacked_rows(inputs: Iterable[torch.Tensor], token_weights: list[torch.Tensor] | None,
                  dtype: torch.dtype) -> Iterator[torch.Tensor]:
    """The inputs' rows (each scaled by sqrt(w_t) with token_weights) in ``dtype``, consecutive samples stacked
    into one [rows, width] tensor of up to STACKED_ROWS rows; a longer sample comes alone. The stack is one
    buffer written again for the next: use each before asking for the next."""
    buffer, filled = None, 0
    for i, x in enumerate(inputs):
        x = x.reshape(-1, x.shape[-1]).float()
        tokens = x.shape[0]
        if tokens > STACKED_ROWS:
            yield _weighted_rows(x, token_weights, i, dtype)
            continue
        if buffer is not None and filled + tokens > STACKED_ROWS:
            yield buffer[:filled]
            filled = 0
        if buffer is None:
            buffer = torch.empty(STACKED_ROWS, x.shape[1], dtype=dtype)
        _weighted_rows(x, token_weights, i, dtype, out=buffer[filled:filled + tokens])
        filled += tokens
    if filled:
        yield buffer[:filled]


def input_error_cross(reference_inputs: list[torch.Tensor], inputs: Iterable[torch.Tensor],
                      token_weights: list[torch.Tensor] | None = None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """C = sum of (x_ref - x)^T x over paired tokens (each weighted by w_t when token_weights are given):
    how the error earlier quantized layers left in the inputs lines up with the inputs. The cross product
    D = x_ref^T x is H + C; C is formed from the difference in float32 first, so bfloat16 products
    round it relative to its own size, not to H's, which it differs from by a few percent. ``inputs`` may be
    read one sample at a time (any iterable paired with reference_inputs)."""
    width = reference_inputs[0].shape[-1]
    cross = torch.zeros(width, width)
    for i, (x_ref, x) in enumerate(zip(reference_inputs, inputs)):
        x = _weighted_rows(x.reshape(-1, width).float(), token_weights, i)
        error = _weighted_rows(x_ref.reshape(-1, width).float(), token_weights, i) - x
        cross += error.to(dtype).T @ x.to(dtype)
    return cross


def _weighted_rows(x: torch.Tensor, token_weights: list[torch.Tensor] | None, index: int,
                   dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows scaled by sqrt(w_t), so each token's x x^T counts w_t times, in ``dtype`` (written into ``out`` when
    given): one sample at a time, so a weighted copy of every sample's inputs is never held at once. The product
    is rounded to dtype as it is written (one pass over the rows instead of two)."""
    if token_weights is None:
        return x.to(dtype) if out is None else out.copy_(x)
    if out is None:
        out = torch.empty(x.shape, dtype=dtype)
    return torch.mul(x, token_weights[index].sqrt()[:, None], out=out)


def fp_target_weight(weight: torch.Tensor, hessian: torch.Tensor, error_cross: torch.Tensor,
                     damp: float) -> torch.Tensor:
    """The weight V that best maps the quantized model's inputs X to the full-precision outputs X_ref W^T:
    argmin ||X_ref W^T - X V^T||^2 + lam ||V - W||^2 = W (D + lam I)(H + lam I)^-1, D = X_ref^T X = H + C
    (C: input_error_cross), so V = W + W C (H + lam I)^-1, lam = damp * mean(diag H). Because V solves the
    normal equations, ||X_ref W^T - X Q^T||^2 = const + ||X (V - Q)^T||^2 for every Q: GPTQ on V with H
    minimizes the error against the full-precision outputs, correcting what earlier quantized layers
    left in the input (asymmetric calibration, as GPTAQ). With no earlier error (C = 0) V = W."""
    lam = damp * float(hessian.diagonal().mean())
    eye = torch.eye(hessian.shape[0], dtype=torch.float32)
    # V = W + Y^T with (H + lam I) Y = C^T W^T   (H symmetric)
    lower, info = torch.linalg.cholesky_ex(hessian.float() + lam * eye)
    if info != 0:  # H is zero or not finite: no inputs to fit a correction on
        return weight.float().clone()
    correction = torch.cholesky_solve(error_cross.float().T @ weight.float().T, lower)
    return (weight.float() + correction.T).contiguous()


def target_errors(weight: torch.Tensor, approxes: list[torch.Tensor], reference_hessian: torch.Tensor,
                  error_cross: torch.Tensor, hessian: torch.Tensor) -> tuple[float, list[float]]:
    """The full-precision output energy tr(W H_ref W^T), and for each A the error against it,
    ||X_ref W^T - X A^T||^2 = tr(W H_ref W^T) - 2 tr(W D A^T) + tr(A H A^T), D = H + C, sharing the
    terms of W. Products in float32, their sums in float64: the error is a difference of large terms."""
    w = weight.float()
    energy = ((w @ reference_hessian) * w).double().sum()
    w_cross = w @ (hessian + error_cross)
    return float(energy), [float(energy - 2 * (w_cross * a).double().sum() + ((a.float() @ hessian) * a).double().sum())
                           for a in approxes]


def inverse_hessian_factor(hessian: torch.Tensor, damp: float) -> tuple[torch.Tensor | None, float]:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, raising damp until H is positive definite."""
    mean_diag = hessian.diagonal().mean()
    eye = torch.eye(hessian.shape[0], dtype=hessian.dtype)
    while damp <= MAX_DAMP:
        lower, info = torch.linalg.cholesky_ex(hessian + damp * mean_diag * eye)
        if info == 0:
            inverse = torch.cholesky_inverse(lower)
            upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
            if info == 0:
                return upper, damp
        damp = round(damp + 0.01, 4) if damp >= 0.01 else 0.01
    return None, damp


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, scheme: WeightScheme, block_size: int = 128,
                  damp: float = 0.01, act_order: bool = False, mse: bool = False) -> GPTQResult:
    """Quantize ``weight`` [out, in] given the input Hessian [in, in].

    With ``act_order`` columns are visited by decreasing Hessian diagonal; group parameters are then
    computed up front from the original weight (static groups), so groups stay contiguous and no
    g_idx needs to be stored. With ``mse`` each group's range may shrink where that lowers its rounding
    error, each column's error weighted by its input's energy (diag H)."""
    w = weight.detach().clone().float()
    h = hessian.detach().clone().float()
    out_features, in_features = w.shape
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    width = scheme.width(in_features)
    if block_size % width and width % block_size:
        block_size = width
    # With mse, a column's rounding error counts by its input's energy (diag H), as in the output error.
    energy = h.diagonal().clone() if mse else None
    static = _group_params(w, scheme, energy) if act_order or scheme.group_size == -1 else None
    perm = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(in_features)
    w, h = w[:, perm], h[perm][:, perm]
    hinv, damp_used = inverse_hessian_factor(h, damp)
    rtn_fallback = hinv is None
    if rtn_fallback:
        hinv = torch.eye(in_features)
    q = torch.zeros_like(w)
    if static is not None:
        scales, zeros = static[0].contiguous(), static[1].contiguous()
    else:  # filled group by group below
        scales = torch.zeros(out_features, scheme.groups(in_features))
        zeros = torch.zeros_like(scales)
    column_groups = (perm // width).contiguous()
    for start in range(0, in_features, block_size):
        end = min(start + block_size, in_features)
        block = w[:, start:end].contiguous()
        codes, errors = torch.empty_like(block), torch.empty_like(block)
        block_hinv = hinv[start:end, start:end].contiguous()
        # Dynamic groups take their parameters from the error-updated columns when their first column comes up.
        cuts = [0, end - start] if static is not None else sorted(
            {0, end - start, *(i for i in range(end - start) if (start + i) % width == 0)})
        for first, last in zip(cuts, cuts[1:]):
            if static is None and (start + first) % width == 0:
                group = (start + first) // width  # no act_order here, so columns are in order
                columns = slice(start + first, start + first + width)
                scales[:, group], zeros[:, group] = _row_params(block[:, first:first + width], scheme,
                                                                None if energy is None else energy[columns])
            quantize_columns(block, block_hinv, first, last, scales, zeros, column_groups[start:end],
                             scheme.max_q, codes, errors)
        q[:, start:end] = codes
        w[:, end:] -= errors @ hinv[start:end, end:]
    codes = torch.empty_like(q)
    codes[:, perm] = q
    weight_out = QuantizedWeight(q=codes.to(torch.uint8), scale=scales, zero=zeros.to(torch.int32),
                                 bits=scheme.bits, group_size=scheme.group_size, symmetric=scheme.symmetric)
    return GPTQResult(weight=weight_out, damp=damp_used, rtn_fallback=rtn_fallback)


def quantize_columns(block: torch.Tensor, block_hinv: torch.Tensor, first: int, last: int, scale: torch.Tensor,
                     zero: torch.Tensor, column_group: torch.Tensor, max_q: int, codes: torch.Tensor,
                     errors: torch.Tensor) -> None:
    """GPTQ's sequential loop over columns first..last-1 of a block [rows, n]: round each column on its group's
    grid (scale, zero [rows, groups]; column_group [n]), write its codes and its error scaled by the inverse
    Hessian factor's diagonal, and subtract the error's share from the block's later columns (in place).
    The native kernel (native.cpp) rounds every operation as the torch loop does: same results."""
    native = native_loops.module()
    if native is not None:
        native.quantize_columns(block, block_hinv, first, last, scale, zero, column_group, float(max_q), codes, errors)
    else:
        quantize_columns_torch(block, block_hinv, first, last, scale, zero, column_group, max_q, codes, errors)


def quantize_columns_torch(block: torch.Tensor, block_hinv: torch.Tensor, first: int, last: int,
                           scale: torch.Tensor, zero: torch.Tensor, column_group: torch.Tensor, max_q: int,
                           codes: torch.Tensor, errors: torch.Tensor) -> None:
    """The torch form of quantize_columns (the reference, and the path where the kernel cannot be built)."""
    for i, group in zip(range(first, last), column_group[first:last].tolist()):
        step, offset = scale[:, group], zero[:, group]
        code = quantize_to_grid(block[:, i], step, offset, max_q)
        error = (block[:, i] - (code - offset) * step) / block_hinv[i, i]
        codes[:, i], errors[:, i] = code, error
        block[:, i:] -= error[:, None] * block_hinv[i, i:][None, :]


def _row_params(rows: torch.Tensor, scheme: WeightScheme,
                column_energy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero of each row (one group): min/max, or with column energies the MSE grid weighted by them."""
    if column_energy is None:
        return grid_params(rows, scheme)
    return mse_grid_params(rows, scheme, column_weights=column_energy)


def _group_params(w: torch.Tensor, scheme: WeightScheme,
                  column_energy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    out_features, in_features = w.shape
    groups, width = scheme.groups(in_features), scheme.width(in_features)
    energy = None if column_energy is None else column_energy.view(groups, width).repeat(out_features, 1)
    scale, zero = _row_params(w.reshape(out_features * groups, width), scheme, energy)
    return scale.reshape(out_features, groups), zero.reshape(out_features, groups)


def damped_hessian(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    """H + damp * mean(diag H) * I in float32: the output error that GPTQ, refit_scales and coordinate_descent
    all minimize."""
    return hessian.float() + damp * float(hessian.diagonal().mean()) * torch.eye(hessian.shape[0])


def refit_scales(quantized: QuantizedWeight, target: torch.Tensor, hessian: torch.Tensor, damp: float,
                 scale_dtype: torch.dtype = torch.float16) -> QuantizedWeight:
    """Keep the codes and zero points, and re-solve each row's group scales by least squares on the
    output error tr((T - Q) H (T - Q)^T), H damped as GPTQ damps it. GPTQ fixes a group's scale
    before it has chosen the codes (and then moves the later columns), so the scales it ends with
    are rarely the best ones for its codes. Zero points stay integers as the formats store them,
    so each row is linear in its scales s: Q = sum_g s_g A_g with A = q - zero, and the best s
    solves M s = r, M_gh = A_g H A_h^T, r_g = A_g H T^T. A row keeps its old scales when the new
    ones (rounded to ``scale_dtype``) are not positive or do not lower its error."""
    out_features, in_features = target.shape
    groups = quantized.scale.shape[1]
    width = in_features // groups
    if quantized.g_idx is not None or groups * width != in_features:
        return quantized  # only contiguous groups
    h = damped_hessian(hessian, damp)
    codes = quantized.q.float() - quantized.zero.float().repeat_interleave(width, dim=1)  # A, [out, in]
    r = (codes * (target.float() @ h)).view(out_features, groups, width).sum(-1).double()
    m = torch.empty(out_features, groups, groups)
    for g in range(groups):
        columns = slice(g * width, (g + 1) * width)
        m[:, g, :] = ((codes[:, columns] @ h[columns, :]) * codes).view(out_features, groups, width).sum(-1)
    m = m.double()
    ridge = 1e-9 * m.diagonal(dim1=1, dim2=2).clamp(min=1e-30)
    new = torch.linalg.solve(m + torch.diag_embed(ridge), r.unsqueeze(-1)).squeeze(-1)
    old = quantized.scale.double()
    new = torch.where(torch.isfinite(new) & (new > 0), new, old)
    new = new.clamp(min=torch.finfo(scale_dtype).tiny).to(scale_dtype).double()

    def error(s: torch.Tensor) -> torch.Tensor:  # up to the constant tr(T H T^T)
        return (s.unsqueeze(1) @ m @ s.unsqueeze(-1)).view(-1) - 2 * (r * s).sum(-1)

    better = error(new) < error(old)
    scale = torch.where(better[:, None], new, old).float()
    return QuantizedWeight(q=quantized.q, scale=scale, zero=quantized.zero, bits=quantized.bits,
                           group_size=quantized.group_size, symmetric=quantized.symmetric)


def coordinate_descent(quantized: QuantizedWeight, target: torch.Tensor, hessian: torch.Tensor, damp: float,
                       sweeps: int) -> QuantizedWeight:
    """Revisit GPTQ's codes by cyclic coordinate descent on the same damped output error
    tr((T - Q) (H + damp * mean(diag H) * I) (T - Q)^T), scales and zero points held (QuantEase, Behdin et
    al. 2023; CDQuant, Nair and Suggala 2024). GPTQ decides each column once and only moves the columns
    after it, so no code is revisited once the later ones are known. Here each code in turn moves to the
    integer that minimizes its row's error with every other code held (the error is quadratic in one code:
    the nearest integer to the unconstrained optimum, clamped to the grid), columns visited by decreasing H
    diagonal, until a sweep changes nothing or ``sweeps`` ran. No step raises the error. AWQ runs it
    on its rounded codes too (the scaled weight as target, its own damping)."""
    h = damped_hessian(hessian, damp).contiguous()
    column_group = quantized.group_index().contiguous()
    codes = quantized.q.float().contiguous()
    scale = quantized.scale.float().contiguous()
    gradient = ((quantized.dequantize() - target.float()) @ h).contiguous()  # (Q - T) H, kept up to date as codes move
    order = torch.argsort(h.diagonal(), descending=True).contiguous()
    max_q = 2**quantized.bits - 1
    native = native_loops.module()
    if native is not None:
        native.coordinate_descent(codes, gradient, h, scale, column_group, order, float(max_q), sweeps)
    else:
        coordinate_descent_torch(codes, gradient, h, scale, column_group, order, max_q, sweeps)
    return QuantizedWeight(q=codes.to(torch.uint8), scale=quantized.scale, zero=quantized.zero, bits=quantized.bits,
                           group_size=quantized.group_size, symmetric=quantized.symmetric, g_idx=quantized.g_idx)


def coordinate_descent_torch(codes: torch.Tensor, gradient: torch.Tensor, hessian: torch.Tensor, scale: torch.Tensor,
                             column_group: torch.Tensor, order: torch.Tensor, max_q: int, sweeps: int) -> int:
    """The torch form of the native coordinate descent (the reference, and the path where the kernel cannot be
    built): all rows at once, column by column; codes and gradient [rows, n] updated in place. Returns how
    many codes moved."""
    moved = 0
    for _ in range(sweeps):
        moved_this_sweep = 0
        for j, group in zip(order.tolist(), column_group[order].tolist()):
            step, curvature = scale[:, group], hessian[j, j]
            if not curvature > 0:  # an input that never fired, with nothing to damp it: no error to lower
                continue
            delta = torch.where(step > 0, torch.round(-gradient[:, j] / (step * curvature)), 0.0)
            delta = torch.minimum(torch.maximum(delta, -codes[:, j]), max_q - codes[:, j])
            rows = delta.nonzero().squeeze(1)
            if rows.numel():
                codes[rows, j] += delta[rows]
                gradient[rows] += (delta[rows] * step[rows])[:, None] * hessian[j][None, :]
                moved_this_sweep += rows.numel()
        moved += moved_this_sweep
        if not moved_this_sweep:
            break
    return moved
