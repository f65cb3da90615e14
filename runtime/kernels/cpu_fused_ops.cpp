// Fused elementwise ops of a Llama decoder layer on CPU: residual add + RMSNorm, rotary embedding, SiLU-and-mul.
//
// At a 64-sequence decode step each of these touches a few hundred KB, so in torch's form (5-7 ops each, with
// float32 round trips) per-op dispatch and allocation, not arithmetic, are their cost: ~25% of a bf16 step in
// the profile. Each does the arithmetic of the torch code it replaces (runtime/layers/norm.py, rotary.py,
// models/llama.py) in the same order, rounding to the tensor dtype (float32 or bfloat16) where torch would,
// so results equal torch's up to float32 summation order (RMSNorm's mean) and libm's exp (SiLU).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

namespace {

// bf16 <-> float: the exact widening, and rounding to nearest even as torch's conversion does (NaN kept NaN).
inline float widen(at::BFloat16 v) { return static_cast<float>(v); }
inline float widen(float v) { return v; }
template <typename T> inline T narrow(float v) { return static_cast<T>(v); }
template <typename T> inline float rounded(float v) { return widen(narrow<T>(v)); }

template <typename T>
void rms_norm_rows(const T* x, const T* residual, const T* weight, float eps, int64_t rows, int64_t hidden,
                   T* out, T* sum_out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> h(hidden);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * hidden;
      float squares = 0.f;
      for (int64_t i = 0; i < hidden; ++i) {
        // h = x + residual in the tensor dtype, as torch's add rounds it.
        const float v = residual ? rounded<T>(widen(xr[i]) + widen(residual[r * hidden + i])) : widen(xr[i]);
        h[i] = v;
        squares += v * v;
        if (sum_out) sum_out[r * hidden + i] = narrow<T>(v);
      }
      const float inv = 1.f / std::sqrt(squares / hidden + eps);
      for (int64_t i = 0; i < hidden; ++i) out[r * hidden + i] = narrow<T>(widen(weight[i]) * rounded<T>(h[i] * inv));
    }
  });
}

// (normed, h): h = x + residual (x alone when residual is empty), normed = weight * (h / rms(h)).
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [T, hidden] tensor");
  const bool add = residual.numel() > 0;
  TORCH_CHECK(!add || (residual.sizes() == x.sizes() && residual.is_contiguous() &&
                       residual.scalar_type() == x.scalar_type()), "residual must match x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type() &&
                  weight.is_contiguous(), "weight must be [hidden] in x's dtype");
  const int64_t rows = x.size(0), hidden = x.size(1);
  torch::Tensor out = torch::empty_like(x), h = add ? torch::empty_like(x) : x;
  if (x.scalar_type() == torch::kFloat32) {
    rms_norm_rows<float>(x.data_ptr<float>(), add ? residual.data_ptr<float>() : nullptr, weight.data_ptr<float>(),
                         eps, rows, hidden, out.data_ptr<float>(), add ? h.data_ptr<float>() : nullptr);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
    using B = at::BFloat16;
    rms_norm_rows<B>(x.data_ptr<B>(), add ? residual.data_ptr<B>() : nullptr, weight.data_ptr<B>(), eps, rows,
                     hidden, out.data_ptr<B>(), add ? h.data_ptr<B>() : nullptr);
  }
  return {out, h};
}

// In place: x[t, h] = x * cos[t] + rotate_half(x) * sin[t], each product and the sum rounded to the dtype
// (torch's three ops). x is [T, heads, D] with any row stride (a view into the fused q/k/v output).
template <typename T>
__attribute__((optimize("fp-contract=off")))  // torch multiplies and adds separately: no fused multiply-add
void rotate(T* x, int64_t tokens, int64_t heads, int64_t dim, int64_t token_stride, int64_t head_stride,
            const T* cos, const T* sin) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(dim);
    for (int64_t t = begin; t < end; ++t) {
      const T *c = cos + t * dim, *s = sin + t * dim;
      for (int64_t h = 0; h < heads; ++h) {
        T* xr = x + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < dim; ++i) row[i] = widen(xr[i]);
        for (int64_t i = 0; i < dim; ++i) {
          const float rotated = i < half ? -row[i + half] : row[i - half];
          const float a = rounded<T>(row[i] * widen(c[i])), b = rounded<T>(rotated * widen(s[i]));
          xr[i] = narrow<T>(a + b);
        }
      }
    }
  });
}

void rotary_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x must be [T, heads, D] with contiguous rows");
  const int64_t tokens = x.size(0), dim = x.size(2);
  TORCH_CHECK(dim % 2 == 0, "head dim must be even");
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == tokens && t->size(1) == dim && t->is_contiguous() &&
                    t->scalar_type() == x.scalar_type(), "cos and sin must be contiguous [T, D] in x's dtype");
  if (x.scalar_type() == torch::kFloat32) {
    rotate<float>(x.data_ptr<float>(), tokens, x.size(1), dim, x.stride(0), x.stride(1), cos.data_ptr<float>(),
                  sin.data_ptr<float>());
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
    using B = at::BFloat16;
    rotate<B>(x.data_ptr<B>(), tokens, x.size(1), dim, x.stride(0), x.stride(1), cos.data_ptr<B>(), sin.data_ptr<B>());
  }
}

// [T, 2I] -> [T, I]: silu(gate) * up, gate = columns [0, I), up = [I, 2I); silu rounded to the dtype first.
template <typename T>
void silu_mul_rows(const T* gate_up, int64_t rows, int64_t inner, T* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T *g = gate_up + r * 2 * inner, *u = g + inner;
      for (int64_t i = 0; i < inner; ++i) {
        const float gi = widen(g[i]);
        out[r * inner + i] = narrow<T>(rounded<T>(gi / (1.f + std::exp(-gi))) * widen(u[i]));
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be a contiguous [T, 2 * intermediate] tensor");
  const int64_t rows = gate_up.size(0), inner = gate_up.size(1) / 2;
  torch::Tensor out = torch::empty({rows, inner}, gate_up.options());
  if (gate_up.scalar_type() == torch::kFloat32) {
    silu_mul_rows<float>(gate_up.data_ptr<float>(), rows, inner, out.data_ptr<float>());
  } else {
    TORCH_CHECK(gate_up.scalar_type() == torch::kBFloat16, "gate_up must be float32 or bfloat16");
    using B = at::BFloat16;
    silu_mul_rows<B>(gate_up.data_ptr<B>(), rows, inner, out.data_ptr<B>());
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "(RMSNorm(x + residual), x + residual)");
  m.def("rotary_", &rotary_, "rotary embedding in place, rotate-half layout");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate/up output");
}
