// The quantization algorithms' hot loops on CPU, row by row with each row's data in L1 (torch's forms make
// ~10 passes over memory per column or candidate):
// - quantize_columns (GPTQ): quantize a run of columns of one block, each column's rounding error spread over
//   the block's later columns through the inverse Hessian factor. Sequential in columns, independent across rows.
// - mse_grid (GPTQ): each row's best shrunken range (rtn.mse_grid_params): every candidate's grid, codes and
//   weighted squared error.
// - coordinate_descent (GPTQ): revisit each row's codes one at a time, each moved to the integer that minimizes the
//   row's output error with the others held, sweep after sweep. Independent across rows.
// - clip_search (AWQ): each (row, group)'s best clipping range (awq.search_clip): every candidate's clipped
//   group, grid, codes and error in the group's partial output.
// Built without -ffast-math and with FMA contraction off, so every operation rounds as torch's float32 ops
// do: quantize_columns and coordinate_descent equal the torch loops bit for bit; mse_grid's and clip_search's
// errors differ from torch's only in summation order.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// A value's code on a grid, as rtn.quantize_to_grid computes it: clamp(round(value / step) + offset, 0, max_q).
inline float grid_code(float value, float step, float offset, float max_q) {
  return std::min(std::max(std::nearbyint(value / step) + offset, 0.0f), max_q);
}

// block [rows, n] float32, updated in place; hinv [n, n] float32 (the block's part of the upper Cholesky
// factor of H^-1); scale, zero [rows, groups] float32; column_group [n] int64: each column's group;
// codes, errors [rows, n] float32, written for columns first..last-1.
void quantize_columns(torch::Tensor block, torch::Tensor hinv, int64_t first, int64_t last, torch::Tensor scale,
                      torch::Tensor zero, torch::Tensor column_group, double max_q, torch::Tensor codes,
                      torch::Tensor errors) {
  TORCH_CHECK(block.dim() == 2 && block.scalar_type() == torch::kFloat32 && block.is_contiguous(),
              "block must be a contiguous float32 [rows, n]");
  const int64_t rows = block.size(0), n = block.size(1), groups = scale.size(1);
  TORCH_CHECK(hinv.sizes() == torch::IntArrayRef({n, n}) && hinv.scalar_type() == torch::kFloat32 &&
                  hinv.is_contiguous(), "hinv must be a contiguous float32 [n, n]");
  TORCH_CHECK(scale.sizes() == zero.sizes() && scale.size(0) == rows && scale.is_contiguous() &&
                  zero.is_contiguous() && scale.scalar_type() == torch::kFloat32 &&
                  zero.scalar_type() == torch::kFloat32, "scale and zero must be contiguous float32 [rows, groups]");
  TORCH_CHECK(column_group.numel() == n && column_group.scalar_type() == torch::kInt64 && column_group.is_contiguous(),
              "column_group must be int64 [n]");
  TORCH_CHECK(codes.sizes() == block.sizes() && errors.sizes() == block.sizes() && codes.is_contiguous() &&
                  errors.is_contiguous() && codes.scalar_type() == torch::kFloat32 &&
                  errors.scalar_type() == torch::kFloat32, "codes and errors must be contiguous float32 like block");
  TORCH_CHECK(0 <= first && first <= last && last <= n, "columns out of range");
  const int64_t* group_of = column_group.data_ptr<int64_t>();
  for (int64_t i = first; i < last; ++i) TORCH_CHECK(0 <= group_of[i] && group_of[i] < groups, "group out of range");

  float* b = block.data_ptr<float>();
  const float* h = hinv.data_ptr<float>();
  const float* s = scale.data_ptr<float>();
  const float* z = zero.data_ptr<float>();
  float* q = codes.data_ptr<float>();
  float* e = errors.data_ptr<float>();
  const float top = static_cast<float>(max_q);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = b + r * n;
      for (int64_t i = first; i < last; ++i) {
        const float step = s[r * groups + group_of[i]], offset = z[r * groups + group_of[i]];
        const float code = grid_code(row[i], step, offset, top);
        const float error = (row[i] - (code - offset) * step) / h[i * n + i];
        q[r * n + i] = code;
        e[r * n + i] = error;
        const float* h_row = h + i * n;
        for (int64_t j = i; j < n; ++j) {
          const float update = error * h_row[j];
          row[j] = row[j] - update;
        }
      }
    }
  });
}

// The grid of one range [low, high] (low <= 0 <= high), as rtn.grid_params computes it: scale rounded to the
// dtype checkpoints store it in.
template <typename ScaleT>
void grid(float low, float high, int bits, bool symmetric, float* scale, float* zero) {
  const float max_q = static_cast<float>((1 << bits) - 1);
  float step, offset;
  if (symmetric) {
    step = std::max(-low, high) / (static_cast<float>(1 << (bits - 1)) - 0.5f);
    offset = static_cast<float>(1 << (bits - 1));
  } else {
    step = (high - low) / max_q;
    offset = std::nearbyint(-low / std::max(step, std::numeric_limits<float>::min()));
  }
  if (step == 0.0f) step = 1.0f;  // an all-zero row stays exactly zero
  step = std::max(step, static_cast<float>(std::numeric_limits<ScaleT>::min()));
  *scale = static_cast<float>(static_cast<ScaleT>(step));
  *zero = std::min(std::max(offset, 0.0f), max_q);
}

// grid() with the scale dtype picked at run time: 0 float32, 1 float16, 2 bfloat16.
inline void grid_in(int64_t scale_dtype, float low, float high, int bits, bool symmetric, float* scale, float* zero) {
  if (scale_dtype == 2) grid<c10::BFloat16>(low, high, bits, symmetric, scale, zero);
  else if (scale_dtype == 1) grid<c10::Half>(low, high, bits, symmetric, scale, zero);
  else grid<float>(low, high, bits, symmetric, scale, zero);
}

// w [rows, cols] float32; weights: [cols] or [rows, cols] float32 (or empty: unweighted); factors [candidates]
// float32, 1.0 first. Returns (scale, zero) [rows] of each row's candidate with the least error (the first
// of equal ones).
// scale_dtype: 0 float32, 1 float16, 2 bfloat16.
std::vector<torch::Tensor> mse_grid(torch::Tensor w, torch::Tensor weights, torch::Tensor factors, int64_t bits,
                                    bool symmetric, int64_t scale_dtype) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous(), "w must be a contiguous float32 [rows, cols]");
  TORCH_CHECK(factors.scalar_type() == torch::kFloat32 && factors.is_contiguous(), "factors must be float32");
  TORCH_CHECK(0 <= scale_dtype && scale_dtype <= 2 && 1 <= bits && bits <= 8, "bad scale dtype or bits");
  const int64_t rows = w.size(0), cols = w.size(1), count = factors.numel();
  const bool weighted = weights.numel() > 0;
  int64_t weight_row_stride = 0;
  if (weighted) {
    TORCH_CHECK(weights.scalar_type() == torch::kFloat32 && weights.is_contiguous() &&
                    (weights.sizes() == torch::IntArrayRef({cols}) || weights.sizes() == w.sizes()),
                "weights must be contiguous float32 [cols] or [rows, cols]");
    weight_row_stride = weights.dim() == 2 ? cols : 0;
  }
  auto scale = torch::empty({rows}, w.options()), zero = torch::empty({rows}, w.options());
  const float* x = w.data_ptr<float>();
  const float* cw = weighted ? weights.data_ptr<float>() : nullptr;
  const float* f = factors.data_ptr<float>();
  float* best_scale = scale.data_ptr<float>();
  float* best_zero = zero.data_ptr<float>();
  const float max_q = static_cast<float>((1 << bits) - 1);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * cols;
      const float* row_weights = weighted ? cw + r * weight_row_stride : nullptr;
      float low = 0.0f, high = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        low = std::min(low, row[c]);
        high = std::max(high, row[c]);
      }
      float best = std::numeric_limits<float>::infinity();
      for (int64_t k = 0; k < count; ++k) {
        float step, offset;
        const float lo = low * f[k], hi = high * f[k];
        grid_in(scale_dtype, lo, hi, bits, symmetric, &step, &offset);
        float error = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
          const float code = grid_code(row[c], step, offset, max_q);
          const float diff = (code - offset) * step - row[c];
          error += weighted ? diff * diff * row_weights[c] : diff * diff;
        }
        if (error < best || k == 0) {
          best = error;
          best_scale[r] = step;
          best_zero[r] = offset;
        }
      }
    }
  });
  return {scale, zero};
}

// The error a group's rounding leaves in its partial output, d^T B d, with B [Width, Width] row-major: y = B d
// accumulated row by row (independent lanes, so it vectorizes without reassociating a sum), then d . y. The
// width is a compile-time constant so that y stays in registers (2-3x faster at 64 than a run-time width).
template <int Width>
float block_error(const float* __restrict__ d, const float* __restrict__ block) {
  float y[Width] = {};
  for (int i = 0; i < Width; ++i) {
    const float di = d[i];
    const float* __restrict__ b = block + i * Width;
    for (int j = 0; j < Width; ++j) y[j] = std::fma(di, b[j], y[j]);
  }
  float error = 0.0f;
  for (int j = 0; j < Width; ++j) error += d[j] * y[j];
  return error;
}

using BlockError = float (*)(const float*, const float*);

// The group widths clip_search takes (awq.NATIVE_CLIP_WIDTHS); others run in torch.
BlockError block_error_for(int64_t width) {
  switch (width) {
    case 16: return block_error<16>;
    case 32: return block_error<32>;
    case 64: return block_error<64>;
    case 128: return block_error<128>;
    default: return nullptr;
  }
}

// w [rows, groups, width] float32; blocks [groups, width, width] float32 (H's diagonal blocks); factors
// [steps] float32, 1.0 first. Candidates, in awq.search_clip's order: [-absmax f, absmax f] for each f, then
// with `independent` [min f_i, max f_j] for every (i, j) (min clamped to <= 0, max to >= 0). Each clips the
// group, rounds it on the clipped values' grid and scores d^T B d with d = w - rounded; the first of equal
// errors wins. Returns (low, high) [rows, groups] of the winners. scale_dtype: 0 float32, 1 float16, 2 bfloat16.
std::vector<torch::Tensor> clip_search(torch::Tensor w, torch::Tensor blocks, torch::Tensor factors,
                                       bool independent, int64_t bits, bool symmetric, int64_t scale_dtype) {
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == torch::kFloat32 && w.is_contiguous(),
              "w must be a contiguous float32 [rows, groups, width]");
  const int64_t rows = w.size(0), groups = w.size(1), width = w.size(2), steps = factors.numel();
  TORCH_CHECK(blocks.sizes() == torch::IntArrayRef({groups, width, width}) &&
                  blocks.scalar_type() == torch::kFloat32 && blocks.is_contiguous(),
              "blocks must be a contiguous float32 [groups, width, width]");
  TORCH_CHECK(factors.scalar_type() == torch::kFloat32 && factors.is_contiguous() && steps > 0,
              "factors must be float32");
  TORCH_CHECK(0 <= scale_dtype && scale_dtype <= 2 && 1 <= bits && bits <= 8, "bad scale dtype or bits");
  const BlockError error_of = block_error_for(width);
  TORCH_CHECK(error_of != nullptr, "group width must be 16, 32, 64 or 128");
  auto best_low = torch::empty({rows, groups}, w.options()), best_high = torch::empty({rows, groups}, w.options());
  const float* x = w.data_ptr<float>();
  const float* h = blocks.data_ptr<float>();
  const float* f = factors.data_ptr<float>();
  float* out_low = best_low.data_ptr<float>();
  float* out_high = best_high.data_ptr<float>();
  const float max_q = static_cast<float>((1 << bits) - 1);
  at::parallel_for(0, rows * groups, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> d(width);
    for (int64_t item = begin; item < end; ++item) {
      const float* values = x + item * width;
      const float* block = h + (item % groups) * width * width;
      float absmax = 0.0f, min_value = 0.0f, max_value = 0.0f;
      for (int64_t c = 0; c < width; ++c) {
        absmax = std::max(absmax, std::fabs(values[c]));
        min_value = std::min(min_value, values[c]);
        max_value = std::max(max_value, values[c]);
      }
      float best = std::numeric_limits<float>::infinity();
      auto score = [&](float low, float high) {
        float lo = 0.0f, hi = 0.0f;  // the clipped group's range, as rtn.grid_params takes it
        for (int64_t c = 0; c < width; ++c) {
          const float clipped = std::max(std::min(values[c], high), low);
          lo = std::min(lo, clipped);
          hi = std::max(hi, clipped);
        }
        float step, offset;
        grid_in(scale_dtype, lo, hi, bits, symmetric, &step, &offset);
        for (int64_t c = 0; c < width; ++c) {
          const float clipped = std::max(std::min(values[c], high), low);
          d[c] = values[c] - (grid_code(clipped, step, offset, max_q) - offset) * step;
        }
        const float error = error_of(d.data(), block);
        if (error < best) {
          best = error;
          out_low[item] = low;
          out_high[item] = high;
        }
      };
      out_low[item] = -absmax * f[0];
      out_high[item] = absmax * f[0];
      for (int64_t i = 0; i < steps; ++i) score(-absmax * f[i], absmax * f[i]);
      if (independent)
        for (int64_t i = 0; i < steps; ++i)
          for (int64_t j = 0; j < steps; ++j) score(min_value * f[i], max_value * f[j]);
    }
  });
  return {best_low, best_high};
}

// codes [rows, n] float32 (integers 0..max_q), updated in place; gradient [rows, n] float32: (Q - T) H, kept up to
// date as codes change; hessian [n, n] float32 (damped); scale [rows, groups] float32; column_group [n] int64;
// order [n] int64: the columns in the order each sweep visits them. Each row independently: every column's code
// moves to the integer that minimizes the row's error with the other codes held, sweep after sweep, until a
// sweep changes nothing or `sweeps` ran. Returns how many codes changed.
int64_t coordinate_descent(torch::Tensor codes, torch::Tensor gradient, torch::Tensor hessian, torch::Tensor scale,
                           torch::Tensor column_group, torch::Tensor order, double max_q, int64_t sweeps) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == torch::kFloat32 && codes.is_contiguous(),
              "codes must be a contiguous float32 [rows, n]");
  const int64_t rows = codes.size(0), n = codes.size(1), groups = scale.size(1);
  TORCH_CHECK(gradient.sizes() == codes.sizes() && gradient.scalar_type() == torch::kFloat32 &&
                  gradient.is_contiguous(), "gradient must be a contiguous float32 like codes");
  TORCH_CHECK(hessian.sizes() == torch::IntArrayRef({n, n}) && hessian.scalar_type() == torch::kFloat32 &&
                  hessian.is_contiguous(), "hessian must be a contiguous float32 [n, n]");
  TORCH_CHECK(scale.size(0) == rows && scale.scalar_type() == torch::kFloat32 && scale.is_contiguous(),
              "scale must be a contiguous float32 [rows, groups]");
  TORCH_CHECK(column_group.numel() == n && column_group.scalar_type() == torch::kInt64 && column_group.is_contiguous(),
              "column_group must be int64 [n]");
  TORCH_CHECK(order.numel() == n && order.scalar_type() == torch::kInt64 && order.is_contiguous(),
              "order must be int64 [n]");
  const int64_t* group_of = column_group.data_ptr<int64_t>();
  const int64_t* visit = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(0 <= group_of[i] && group_of[i] < groups, "group out of range");
    TORCH_CHECK(0 <= visit[i] && visit[i] < n, "order out of range");
  }
  float* q = codes.data_ptr<float>();
  float* g = gradient.data_ptr<float>();
  const float* h = hessian.data_ptr<float>();
  const float* s = scale.data_ptr<float>();
  const float top = static_cast<float>(max_q);
  std::atomic<int64_t> changed{0};
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    int64_t local = 0;
    for (int64_t r = begin; r < end; ++r) {
      float* code = q + r * n;
      float* grad = g + r * n;
      for (int64_t sweep = 0; sweep < sweeps; ++sweep) {
        int64_t moved = 0;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t j = visit[k];
          const float step = s[r * groups + group_of[j]], curvature = h[j * n + j];
          if (!(step > 0.0f) || !(curvature > 0.0f)) continue;
          // the error is quadratic in this code: its best integer is the nearest to the unconstrained optimum
          float delta = std::nearbyint(-grad[j] / (step * curvature));
          delta = std::min(std::max(delta, -code[j]), top - code[j]);
          if (delta == 0.0f) continue;
          code[j] += delta;
          const float move = delta * step;
          const float* h_row = h + j * n;
          for (int64_t i = 0; i < n; ++i) grad[i] += move * h_row[i];
          ++moved;
        }
        local += moved;
        if (moved == 0) break;
      }
    }
    changed += local;
  });
  return changed.load();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize_columns", &quantize_columns, "GPTQ's column loop over columns first..last-1 of a block");
  m.def("mse_grid", &mse_grid, "each row's (scale, zero) of the shrunken range with the least squared error");
  m.def("coordinate_descent", &coordinate_descent, "each row's codes by cyclic coordinate descent on its error");
  m.def("clip_search", &clip_search, "each (row, group)'s clipping range with the least partial-output error");
}
