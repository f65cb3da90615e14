// W8A8 INT8 linear on CPU: y [M, n] = (x_q @ W_q^T) * x_scale[m] * w_scale[n] + bias[n], in x's dtype.
//
// Activations are quantized here, in the same call, one row at a time (s = absmax / 127, or the static scale;
// q = clamp(round(x / s), -128, 127), round half to even): as torch ops that costs more than the GEMM itself
// at a few rows. Two multiply paths over one weight layout:
// - vnni, a few rows: AVX-512 VNNI vpdpbusd multiplies unsigned by signed bytes, so x_q + 128 is multiplied
//   and 128 * sum_k W_q[n, k] subtracted (both exact in int32);
// - amx, more rows: AMX tdpbssd multiplies signed bytes directly, 16 x 64 activation tiles against 64 x 16
//   weight tiles.
// The int32 sums are exact; only the rescale rounds (float32, in the order written above, no FMA contraction:
// this file is built with cpu_extension.EXACT_CFLAGS).
//
//   packed    int8 [N / 16, K / 4, 16, 4]: packed[b, r, c, j] = W_q[16 b + c, 4 r + j] (K padded to a multiple
//             of 64, N to a multiple of 16, with zeros). One 64-byte row is both a vpdpbusd operand and a row
//             of an AMX weight tile.
//   col_sums  int32 [N_pad];  w_scale float32 [N_pad];  bias float32 [N_pad] or empty

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define QK_INT8_NATIVE 1
#include <immintrin.h>
#endif
#if defined(QK_INT8_NATIVE) && defined(__AMX_INT8__)
#define QK_INT8_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t COLS = 16;    // output columns per block (one vector of int32 sums)
constexpr int64_t K_STEP = 64;  // K padding: one AMX activation tile row
constexpr int64_t M_BLOCK = 256;  // rows per cache block of the AMX path (see amx_matmul)

#ifdef QK_INT8_NATIVE

struct Weights {
  const int8_t* packed;
  const int32_t* col_sums;
  const float* w_scale;
  const float* bias;  // nullptr: none
  int64_t k_pad, blocks, n;
  const int8_t* block(int64_t b) const { return packed + b * k_pad * COLS; }
};

inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const at::BFloat16* x) {  // bf16 -> float32 is exact: the bits move up 16 places
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load_tail(const float* x, int64_t count) { return _mm512_maskz_loadu_ps((1u << count) - 1, x); }
inline __m512 load_tail(const at::BFloat16* x, int64_t count) {
  const __m256i bits = _mm256_maskz_loadu_epi16((1u << count) - 1, x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Row m of x -> codes (k_pad bytes, zero past k) and its scale, exactly as quantkit.algorithms.int8 does it.
// The row's inputs 64 c .. 64 c + 63 go to codes + c * chunk: chunk 64 is a plain row, chunk 1024 a row of tiles.
template <typename T>
float quantize_row(const T* x, int64_t k, int64_t k_pad, float static_scale, int8_t* codes, int64_t chunk) {
  const int64_t full = k / 16 * 16, tail = k - full;
  float scale = static_scale;
  if (scale <= 0.0f) {
    // Four running maxima: one would wait on the previous max's latency at every vector.
    __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= full; i += 64)
      for (int j = 0; j < 4; ++j) m[j] = _mm512_max_ps(m[j], _mm512_abs_ps(load16(x + i + 16 * j)));
    for (; i < full; i += 16) m[0] = _mm512_max_ps(m[0], _mm512_abs_ps(load16(x + i)));
    if (tail) m[1] = _mm512_max_ps(m[1], _mm512_abs_ps(load_tail(x + full, tail)));
    const __m512 absmax = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
    scale = std::max(_mm512_reduce_max_ps(absmax) / 127.0f, 1e-12f);
  }
  const __m512 s = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
  // Division, not a reciprocal multiply, to round like torch; cvtps rounds half to even (MXCSR default).
  auto codes16 = [&](__m512 v) {
    return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v, s), lo), hi)));
  };
  auto store = [&](int64_t i, __m128i v) {  // 16 codes never straddle a chunk: i is a multiple of 16
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / K_STEP * chunk + i % K_STEP), v);
  };
  for (int64_t i = 0; i < full; i += 16) store(i, codes16(load16(x + i)));
  if (tail) store(full, codes16(load_tail(x + full, tail)));  // lanes past k load 0: code 0
  for (int64_t i = (k + 15) / 16 * 16; i < k_pad; i += 16) store(i, _mm_setzero_si128());
  return scale;
}

// tiled: codes in AMX activation tiles, [M / 16, k_pad / 64, 16, 64], so that a tile is 1 KiB read in order
// (rows k_pad apart made a tile load touch 16 scattered lines); else plain rows [M, k_pad].
void quantize_rows(const torch::Tensor& x, float static_scale, int64_t k_pad, int8_t* codes, float* scales,
                   bool tiled) {
  const int64_t m_rows = x.size(0), k = x.size(1);
  at::parallel_for(0, m_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      int8_t* row = tiled ? codes + m / 16 * 16 * k_pad + m % 16 * K_STEP : codes + m * k_pad;
      const int64_t chunk = tiled ? 16 * K_STEP : K_STEP;
      if (x.scalar_type() == torch::kFloat32)
        scales[m] = quantize_row(x.data_ptr<float>() + m * k, k, k_pad, static_scale, row, chunk);
      else
        scales[m] = quantize_row(x.data_ptr<at::BFloat16>() + m * k, k, k_pad, static_scale, row, chunk);
    }
  });
}

// Column block b's rescale: y[m, 16 b .. 16 b + 16) from one row's int32 sums (exact). Its weight scales, bias
// and store mask are loaded once per column block, not once per row.
struct Rescale {
  int64_t n0;
  __m512 w_scale, bias;
  bool has_bias;
  __mmask16 mask;
  Rescale(const Weights& w, int64_t b)
      : n0(b * COLS), w_scale(_mm512_loadu_ps(w.w_scale + n0)),
        bias(w.bias ? _mm512_loadu_ps(w.bias + n0) : _mm512_setzero_ps()), has_bias(w.bias != nullptr),
        mask(static_cast<__mmask16>((1u << std::min<int64_t>(COLS, w.n - n0)) - 1)) {}

  template <typename Out>
  void store(__m512i sums, float x_scale, Out* y_row) const {
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(x_scale)), w_scale);
    if (has_bias) v = _mm512_add_ps(v, bias);
    if constexpr (std::is_same_v<Out, float>) {
      _mm512_mask_storeu_ps(y_row + n0, mask, v);
    } else {
      _mm256_mask_storeu_epi16(y_row + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));  // round to nearest even
    }
  }
};

// ROWS rows x 4 column blocks: 16 accumulators, each weight vector loaded once for all rows.
template <int ROWS, typename Out>
void vnni_rows(const Weights& w, int64_t b0, int64_t nb, const uint8_t* xu, const float* scales, Out* y,
               int64_t y_stride) {
  __m512i acc[ROWS][4];
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_si512();
  for (int64_t r = 0; r < w.k_pad / 4; ++r) {
    __m512i wv[4];
    for (int j = 0; j < nb; ++j) wv[j] = _mm512_loadu_si512(w.block(b0 + j) + r * 64);
    for (int m = 0; m < ROWS; ++m) {
      int32_t four;
      std::memcpy(&four, xu + m * w.k_pad + 4 * r, 4);
      const __m512i xv = _mm512_set1_epi32(four);
      for (int j = 0; j < nb; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], xv, wv[j]);
    }
  }
  for (int j = 0; j < nb; ++j) {
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(w.col_sums + (b0 + j) * COLS), 7);  // 128 * sum
    const Rescale rescale(w, b0 + j);
    for (int m = 0; m < ROWS; ++m) rescale.store(_mm512_sub_epi32(acc[m][j], offset), scales[m], y + m * y_stride);
  }
}

template <typename Out>
void vnni_matmul(const Weights& w, const int8_t* codes, const float* scales, int64_t m_rows, Out* y) {
  // Signed codes + 128 as unsigned bytes: flipping the top bit.
  std::vector<uint8_t> xu(m_rows * w.k_pad);
  for (int64_t i = 0; i < m_rows * w.k_pad; ++i) xu[i] = static_cast<uint8_t>(codes[i]) ^ 0x80;
  at::parallel_for(0, (w.blocks + 3) / 4, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b0 = 4 * g, nb = std::min<int64_t>(4, w.blocks - b0);
      for (int64_t m = 0; m < m_rows; m += 4) {
        const uint8_t* xm = xu.data() + m * w.k_pad;
        Out* ym = y + m * w.n;
        switch (std::min<int64_t>(4, m_rows - m)) {
          case 1: vnni_rows<1>(w, b0, nb, xm, scales + m, ym, w.n); break;
          case 2: vnni_rows<2>(w, b0, nb, xm, scales + m, ym, w.n); break;
          case 3: vnni_rows<3>(w, b0, nb, xm, scales + m, ym, w.n); break;
          default: vnni_rows<4>(w, b0, nb, xm, scales + m, ym, w.n); break;
        }
      }
    }
  });
}

#ifdef QK_INT8_AMX
// Tile registers: 0-3 sum a 32 x 32 block of y, 4-5 hold 16 rows x 64 inputs of x, 6-7 64 inputs x 16 columns.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool amx_usable() {
  // Linux hands out the AMX register state only on request (ARCH_REQ_XCOMP_PERM for XTILEDATA).
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// Rows in blocks of M_BLOCK, column pairs within a block, 32 rows at a time within a pair: a block's codes
// (M_BLOCK x k_pad) stay in L2 while every pair passes over them (at K = 1536 all 2048 rows' codes did not,
// and each pair read them again from L3), and a pair's weights (32 x k_pad) stay in L1 across the block.
template <typename Out>
void amx_matmul(const Weights& w, const int8_t* codes, const float* scales, int64_t m_rows, Out* y) {
  const int64_t padded_rows = (m_rows + 15) / 16 * 16, pairs = (w.blocks + 1) / 2;
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    TileConfig config;  // per thread
    for (int i = 0; i < 8; ++i) { config.rows[i] = 16; config.colsb[i] = 64; }
    _tile_loadconfig(&config);
    alignas(64) int32_t out[4][16][16];
    for (int64_t mb = 0; mb < padded_rows; mb += M_BLOCK) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t b0 = 2 * p;
        const bool odd = b0 + 1 == w.blocks;  // an odd last block is computed twice, stored once
        const int8_t* w0 = w.block(b0);
        const int8_t* w1 = w.block(odd ? b0 : b0 + 1);
        const Rescale r0(w, b0), r1(w, odd ? b0 : b0 + 1);
        for (int64_t m0 = mb; m0 < std::min(mb + M_BLOCK, padded_rows); m0 += 32) {
          const bool two = m0 + 16 < padded_rows;
          _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
          for (int64_t k0 = 0; k0 < w.k_pad; k0 += K_STEP) {
            _tile_loadd(4, codes + m0 * w.k_pad + k0 * 16, 64);
            _tile_loadd(6, w0 + k0 * COLS, 64);
            _tile_loadd(7, w1 + k0 * COLS, 64);
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            if (two) {
              _tile_loadd(5, codes + (m0 + 16) * w.k_pad + k0 * 16, 64);
              _tile_dpbssd(2, 5, 6);
              _tile_dpbssd(3, 5, 7);
            }
          }
          _tile_stored(0, out[0], 64); _tile_stored(1, out[1], 64);
          if (two) { _tile_stored(2, out[2], 64); _tile_stored(3, out[3], 64); }
          for (int half = 0; half < (two ? 2 : 1); ++half)
            for (int64_t i = 0; i < 16 && m0 + 16 * half + i < m_rows; ++i) {
              const int64_t m = m0 + 16 * half + i;
              r0.store(_mm512_load_si512(out[2 * half][i]), scales[m], y + m * w.n);
              if (!odd) r1.store(_mm512_load_si512(out[2 * half + 1][i]), scales[m], y + m * w.n);
            }
        }
      }
    }
    _tile_release();
  });
}
#endif  // QK_INT8_AMX

#endif  // QK_INT8_NATIVE

bool amx_available() {
#ifdef QK_INT8_AMX
  return amx_usable();
#else
  return false;
#endif
}

bool native_available() {
#ifdef QK_INT8_NATIVE
  return true;
#else
  return false;
#endif
}

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(native_available(), "this CPU (or this build) has no AVX-512 VNNI and BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "x must be float32 or bfloat16");
}

// (codes int8 [M, K], scales float32 [M]): the activations as the GEMM multiplies them (tests compare these).
std::vector<torch::Tensor> int8_quantize(torch::Tensor x, double static_scale) {
  check_x(x);
  const int64_t k = x.size(1), k_pad = (k + K_STEP - 1) / K_STEP * K_STEP;
  torch::Tensor codes = torch::empty({x.size(0), k_pad}, x.options().dtype(torch::kInt8));
  torch::Tensor scales = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat32));
#ifdef QK_INT8_NATIVE
  quantize_rows(x, static_cast<float>(static_scale), k_pad, codes.data_ptr<int8_t>(), scales.data_ptr<float>(),
                false);
#endif
  return {codes.narrow(1, 0, k).contiguous(), scales};
}

torch::Tensor int8_linear(torch::Tensor x, double static_scale, torch::Tensor packed, torch::Tensor col_sums,
                          torch::Tensor w_scale, torch::Tensor bias, int64_t n, bool use_amx) {
  check_x(x);
  TORCH_CHECK(packed.scalar_type() == torch::kInt8 && packed.dim() == 4 && packed.size(2) == COLS &&
                  packed.size(3) == 4 && packed.is_contiguous(), "packed must be a contiguous int8 [N/16, K/4, 16, 4]");
  const int64_t k = x.size(1), k_pad = packed.size(1) * 4, blocks = packed.size(0), n_pad = blocks * COLS;
  TORCH_CHECK(k_pad % K_STEP == 0 && k <= k_pad && k_pad - k < K_STEP, "packed holds ", k_pad, " inputs, x has ", k);
  TORCH_CHECK(n <= n_pad && n > n_pad - COLS, "n = ", n, " does not fit ", blocks, " column blocks");
  TORCH_CHECK(col_sums.scalar_type() == torch::kInt32 && col_sums.numel() == n_pad && col_sums.is_contiguous(),
              "col_sums must be int32 [", n_pad, "]");
  for (const auto* t : {&w_scale, &bias})
    TORCH_CHECK(t->numel() == 0 || (t->scalar_type() == torch::kFloat32 && t->numel() == n_pad && t->is_contiguous()),
                "w_scale and bias must be float32 [", n_pad, "]");
  TORCH_CHECK(w_scale.numel() == n_pad, "w_scale is required");
  TORCH_CHECK(!use_amx || amx_available(), "this CPU (or this build) has no AMX int8");
  const int64_t m_rows = x.size(0), padded_rows = use_amx ? (m_rows + 15) / 16 * 16 : m_rows;
  torch::Tensor y = torch::empty({m_rows, n}, x.options());
#ifdef QK_INT8_NATIVE
  // Padding rows stay zero: AMX reads whole 16-row tiles (the last tile row, zeroed, then partly overwritten).
  torch::Tensor codes = torch::empty({padded_rows, k_pad}, x.options().dtype(torch::kInt8));
  if (padded_rows > m_rows) codes.narrow(0, padded_rows - 16, 16).zero_();
  std::vector<float> scales(m_rows);
  quantize_rows(x, static_cast<float>(static_scale), k_pad, codes.data_ptr<int8_t>(), scales.data(), use_amx);
  const Weights w{packed.data_ptr<int8_t>(), col_sums.data_ptr<int32_t>(), w_scale.data_ptr<float>(),
                  bias.numel() ? bias.data_ptr<float>() : nullptr, k_pad, blocks, n};
  const int8_t* cp = codes.data_ptr<int8_t>();
  const bool f32 = x.scalar_type() == torch::kFloat32;
  auto* yb = reinterpret_cast<uint16_t*>(f32 ? nullptr : y.data_ptr<at::BFloat16>());
#ifdef QK_INT8_AMX
  if (use_amx) {
    if (f32) amx_matmul(w, cp, scales.data(), m_rows, y.data_ptr<float>());
    else amx_matmul(w, cp, scales.data(), m_rows, yb);
    return y;
  }
#endif
  if (f32) vnni_matmul(w, cp, scales.data(), m_rows, y.data_ptr<float>());
  else vnni_matmul(w, cp, scales.data(), m_rows, yb);
#endif
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "W8A8 INT8 linear: per-row int8 activations, VNNI or AMX int8 GEMM, rescale");
  m.def("int8_quantize", &int8_quantize, "int8 activation codes and scales, as int8_linear makes them");
  m.def("native_available", &native_available, "whether this build has the AVX-512 VNNI kernels");
  m.def("amx_available", &amx_available, "whether the AMX int8 path runs here");
}
