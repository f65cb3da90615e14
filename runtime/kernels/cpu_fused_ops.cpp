// Fused elementwise ops of a Llama decoder layer on CPU: residual add + RMSNorm, rotary embedding, SiLU-and-mul;
// and the greedy sampler's row maximum.
//
// At a 64-sequence decode step each of these touches a few hundred KB, so in torch's form (5-7 ops each, with
// float32 round trips) per-op dispatch and allocation, not arithmetic, are their cost: ~25% of a bf16 step in
// the profile. Each does the arithmetic of the torch code it replaces (runtime/layers/norm.py, rotary.py,
// models/llama.py) in the same order, rounding to the tensor dtype (float32 or bfloat16) where torch would,
// so results equal torch's up to float32 summation order (RMSNorm's mean) and libm's exp (SiLU).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

// bfloat16 is handled as its uint16 bits, so that loops over it vectorize: widening is a shift, narrowing
// rounds to nearest even as torch's conversion does (for finite values; NaN is not preserved).
inline float widen(float v) { return v; }
inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}
template <typename T> inline T narrow(float v);
template <> inline float narrow<float>(float v) { return v; }
template <> inline uint16_t narrow<uint16_t>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}
template <typename T> inline float rounded(float v) { return widen(narrow<T>(v)); }

template <typename T> T* data(torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }
template <typename T> const T* data(const torch::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr()); }

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
  auto run = [&](auto zero) {
    using T = decltype(zero);
    rms_norm_rows<T>(data<T>(x), add ? data<T>(residual) : nullptr, data<T>(weight), eps, rows, hidden,
                     data<T>(out), add ? data<T>(h) : nullptr);
  };
  if (x.scalar_type() == torch::kFloat32) {
    run(0.f);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
    run(uint16_t{});
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
  auto run = [&](auto zero) {
    using T = decltype(zero);
    rotate<T>(data<T>(x), tokens, x.size(1), dim, x.stride(0), x.stride(1), data<T>(cos), data<T>(sin));
  };
  if (x.scalar_type() == torch::kFloat32) {
    run(0.f);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
    run(uint16_t{});
  }
}

// [T, 2I] -> [T, I]: silu(gate) * up, gate = columns [0, I), up = [I, 2I); silu rounded to the dtype first.
template <typename T>
void silu_mul_rows(const T* gate_up, int64_t rows, int64_t inner, T* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> silu(inner);  // a float32 pass of its own, so that exp vectorizes (libmvec)
    for (int64_t r = begin; r < end; ++r) {
      const T *g = gate_up + r * 2 * inner, *u = g + inner;
      for (int64_t i = 0; i < inner; ++i) silu[i] = widen(g[i]);
      for (int64_t i = 0; i < inner; ++i) silu[i] = silu[i] / (1.f + std::exp(-silu[i]));
      for (int64_t i = 0; i < inner; ++i) out[r * inner + i] = narrow<T>(rounded<T>(silu[i]) * widen(u[i]));
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be a contiguous [T, 2 * intermediate] tensor");
  const int64_t rows = gate_up.size(0), inner = gate_up.size(1) / 2;
  torch::Tensor out = torch::empty({rows, inner}, gate_up.options());
  if (gate_up.scalar_type() == torch::kFloat32) {
    silu_mul_rows<float>(data<float>(gate_up), rows, inner, data<float>(out));
  } else {
    TORCH_CHECK(gate_up.scalar_type() == torch::kBFloat16, "gate_up must be float32 or bfloat16");
    silu_mul_rows<uint16_t>(data<uint16_t>(gate_up), rows, inner, data<uint16_t>(out));
  }
  return out;
}

// Greedy token per row of float32 logits [B, V]: the first index of the row's maximum (torch's argmax and
// max(dim).indices agree on it). NaN logits are not handled: a row with NaN yields some index.
torch::Tensor greedy_tokens(torch::Tensor logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == torch::kFloat32 &&
                  logits.size(1) > 0, "logits must be a contiguous float32 [B, V] tensor, V > 0");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  torch::Tensor tokens = torch::empty({rows}, logits.options().dtype(torch::kInt64));
  const float* lp = logits.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = lp + r * vocab;
      float best = row[0];
      for (int64_t i = 1; i < vocab; ++i) best = std::max(best, row[i]);  // vectorizes: no index carried
      int64_t at = 0;
      while (row[at] != best) ++at;  // the first index holding it
      tp[r] = at;
    }
  });
  return tokens;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "(RMSNorm(x + residual), x + residual)");
  m.def("rotary_", &rotary_, "rotary embedding in place, rotate-half layout");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate/up output");
  m.def("greedy_tokens", &greedy_tokens, "first index of each row's maximum");
}
