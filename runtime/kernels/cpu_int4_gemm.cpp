// W4A16 INT4 GEMM on CPU: y [M, N] = x [M, K] @ W, W[k, n] = code[k, n] * scale[g(k), n] + offset[g(k), n].
//
// torch's own CPU INT4 kernel (_weight_int4pack_mm) works one row of x at a time: fast for one sequence, but
// at a 64-sequence decode step it ran 5-6x slower than a dense bf16 matmul, whose AMX tiles serve many rows
// at once. Three paths over 64-column tiles of packed codes (cpu_int4.py picks one per call):
// - int4_gemv, a few rows: codes are decoded in registers and multiplied at once, a GEMV bound by reading
//   the packed weights (half a byte per weight). Each group's scale and offset are applied once per group:
//   y = sum_g scale_g * (x_g . code_g) + offset_g * sum(x_g).
// - int4_amx, more rows on a CPU with AMX: each tile is decoded into bf16 in AMX's VNNI layout, a buffer that
//   stays in L2, and every 32 rows of x are multiplied over it with AMX tile instructions.
// - int4_blocks, more rows elsewhere: a block of tiles is decoded into a [K, block] buffer in x's dtype and
//   multiplied by torch's matmul (a call costs ~15-100 us of setup, hence blocks rather than single tiles).
//
//   x        [M, K] float32 or bfloat16, contiguous
//   codes    [tiles, K / 8, 64] int32: nibble j of codes[t, r, c] is the code of input row 8r + j, column 64t + c
//   scales   [tiles, groups, 64] float32;  offsets: same shape, offset = -zero * scale
//   returns  [M, n] in x's dtype (n <= 64 * tiles; the padding columns are dropped)

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef __AMX_BF16__
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t TILE = 64;   // output columns per tile of codes
constexpr int64_t LANES = 16;  // floats per vector
constexpr int64_t VECTORS = TILE / LANES;

typedef float floatv __attribute__((vector_size(64)));
typedef int32_t intv __attribute__((vector_size(64)));
typedef uint32_t uintv __attribute__((vector_size(64)));
typedef uint16_t bf16v __attribute__((vector_size(32)));

inline floatv load(const float* p) { floatv v; std::memcpy(&v, p, sizeof v); return v; }
inline intv load(const int32_t* p) { intv v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, floatv v) { std::memcpy(p, &v, sizeof v); }

// Nibble j of each lane as a float.
inline floatv nibble(intv packed, int j) { return __builtin_convertvector((packed >> (4 * j)) & 0xF, floatv); }

// float32 -> bfloat16, round to nearest even (weights are finite, so no NaN case).
inline void store_bf16(uint16_t* p, floatv v) {
  uintv bits = (uintv)v;
  bits += 0x7FFF + ((bits >> 16) & 1);
  bf16v narrow = __builtin_convertvector(bits >> 16, bf16v);
  std::memcpy(p, &narrow, sizeof narrow);
}

struct Weights {
  const int32_t* codes;
  const float* scales;
  const float* offsets;
  int64_t k, groups, group_size, n, tiles;
  const int32_t* tile_codes(int64_t t) const { return codes + t * (k / 8) * TILE; }
  const float* tile_scales(int64_t t) const { return scales + t * groups * TILE; }
  const float* tile_offsets(int64_t t) const { return offsets + t * groups * TILE; }
};

// Few rows: y[m, tile] = sum_g scale_g * (sum_{k in g} x[m, k] * code[k]) + offset_g * (sum_{k in g} x[m, k]).
// The per-group row sums xsum [M, groups] are computed once per call, so each weight costs a decode and an
// FMA per row; scales and offsets are applied once per group.
template <int ROWS>
void gemv_tile(const Weights& w, int64_t t, const float* x, const float* xsum, float* y, int64_t y_stride) {
  const int32_t* codes = w.tile_codes(t);
  const int64_t packed_per_group = w.group_size / 8;
  floatv acc[ROWS][VECTORS] = {};
  for (int64_t g = 0; g < w.groups; ++g) {
    floatv group_acc[ROWS][VECTORS] = {};
    for (int64_t r = g * packed_per_group; r < (g + 1) * packed_per_group; ++r) {
      intv packed[VECTORS];
      for (int64_t v = 0; v < VECTORS; ++v) packed[v] = load(codes + r * TILE + v * LANES);
      for (int j = 0; j < 8; ++j) {
        floatv q[VECTORS];
        for (int64_t v = 0; v < VECTORS; ++v) q[v] = nibble(packed[v], j);
        for (int m = 0; m < ROWS; ++m) {
          const float xk = x[m * w.k + 8 * r + j];
          for (int64_t v = 0; v < VECTORS; ++v) group_acc[m][v] += xk * q[v];
        }
      }
    }
    const float* scale = w.tile_scales(t) + g * TILE;
    const float* offset = w.tile_offsets(t) + g * TILE;
    for (int64_t v = 0; v < VECTORS; ++v) {
      const floatv s = load(scale + v * LANES), o = load(offset + v * LANES);
      for (int m = 0; m < ROWS; ++m) acc[m][v] += s * group_acc[m][v] + o * xsum[m * w.groups + g];
    }
  }
  for (int m = 0; m < ROWS; ++m)
    for (int64_t v = 0; v < VECTORS; ++v) store(y + m * y_stride + v * LANES, acc[m][v]);
}

// Rows of x in steps of at most 4 (the accumulators of 4 rows x 64 columns fill half the vector registers).
void gemv(const Weights& w, int64_t t, const float* x, const float* xsum, int64_t m_rows, float* y,
          int64_t y_stride) {
  for (int64_t m = 0; m < m_rows; m += 4) {
    const float *xm = x + m * w.k, *sm = xsum + m * w.groups;
    float* ym = y + m * y_stride;
    switch (std::min<int64_t>(4, m_rows - m)) {
      case 1: gemv_tile<1>(w, t, xm, sm, ym, y_stride); break;
      case 2: gemv_tile<2>(w, t, xm, sm, ym, y_stride); break;
      case 3: gemv_tile<3>(w, t, xm, sm, ym, y_stride); break;
      default: gemv_tile<4>(w, t, xm, sm, ym, y_stride); break;
    }
  }
}

// Decode tiles [t0, t0 + count) into buffer [K, count * 64] (row stride count * 64) in float32 or bf16.
template <typename Out>
void decode_tiles(const Weights& w, int64_t t0, int64_t count, Out* buffer) {
  const int64_t width = count * TILE, packed_per_group = w.group_size / 8;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t* codes = w.tile_codes(t0 + i);
    for (int64_t r = 0; r < w.k / 8; ++r) {
      const int64_t g = r / packed_per_group;
      const float* scale = w.tile_scales(t0 + i) + g * TILE;
      const float* offset = w.tile_offsets(t0 + i) + g * TILE;
      for (int64_t v = 0; v < VECTORS; ++v) {
        const intv packed = load(codes + r * TILE + v * LANES);
        const floatv s = load(scale + v * LANES), o = load(offset + v * LANES);
        for (int j = 0; j < 8; ++j) {
          Out* row = buffer + (8 * r + j) * width + i * TILE + v * LANES;
          const floatv value = nibble(packed, j) * s + o;
          if constexpr (std::is_same_v<Out, float>) store(row, value);
          else store_bf16(row, value);
        }
      }
    }
  }
}


#ifdef __AMX_BF16__
// AMX path (bfloat16): each 64-column tile is decoded once into the VNNI layout AMX multiplies, B[k / 2][n]
// holding the pair (k even, k odd) of column n in one 32-bit word, then every 32 rows of x run over it.
// Tile registers: 0-3 accumulate a 32 x 32 block of y, 4-5 hold 16 rows x 32 inputs of x, 6-7 the weights
// of 16 columns x 32 inputs.
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

void configure_tiles() {
  TileConfig config;
  for (int i = 0; i < 8; ++i) { config.rows[i] = 16; config.colsb[i] = 64; }
  _tile_loadconfig(&config);
}

// Columns n of even and odd input rows -> 16 VNNI words (bf16 of even in the low half, odd in the high),
// rounded to nearest even.
inline __m512i vnni_pairs(floatv even, floatv odd, __m512i interleave) {
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh((__m512)odd, (__m512)even);  // [even 0..15 | odd 0..15]
  return _mm512_permutexvar_epi16(interleave, halves);
}

void decode_tile_vnni(const Weights& w, int64_t t, uint32_t* vnni) {
  const int32_t* codes = w.tile_codes(t);
  const int64_t pairs = w.k / 2, packed_per_group = w.group_size / 8;
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t r = 0; r < w.k / 8; ++r) {
    const int64_t g = r / packed_per_group;
    const float* scale = w.tile_scales(t) + g * TILE;
    const float* offset = w.tile_offsets(t) + g * TILE;
    for (int64_t v = 0; v < VECTORS; ++v) {
      const intv packed = load(codes + r * TILE + v * LANES);
      const floatv s = load(scale + v * LANES), o = load(offset + v * LANES);
      for (int p = 0; p < 4; ++p) {
        const __m512i words = vnni_pairs(nibble(packed, 2 * p) * s + o, nibble(packed, 2 * p + 1) * s + o,
                                         interleave);
        _mm512_storeu_si512(vnni + (v * pairs + 4 * r + p) * LANES, words);
      }
    }
  }
}

// y[rows, 64-column tile] = x[rows] @ W[:, tile] for rows [m0, m0 + 32), or [m0, m0 + 16), of the padded
// bf16 x.
template <bool TWO_ROW_BLOCKS>
void amx_rows(const uint16_t* x, int64_t k, int64_t m0, const uint32_t* vnni, float* y, int64_t y_stride) {
  const int64_t pairs = k / 2, x_stride = k * 2, y_bytes = y_stride * 4;
  for (int64_t cb = 0; cb < VECTORS; cb += 2) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k0 = 0; k0 < k; k0 += 32) {
      _tile_loadd(4, x + m0 * k + k0, x_stride);
      if (TWO_ROW_BLOCKS) _tile_loadd(5, x + (m0 + 16) * k + k0, x_stride);
      _tile_loadd(6, vnni + (cb * pairs + k0 / 2) * LANES, 64);
      _tile_loadd(7, vnni + ((cb + 1) * pairs + k0 / 2) * LANES, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (TWO_ROW_BLOCKS) { _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
    }
    float* out = y + m0 * y_stride + cb * LANES;
    _tile_stored(0, out, y_bytes);
    _tile_stored(1, out + LANES, y_bytes);
    if (TWO_ROW_BLOCKS) {
      _tile_stored(2, out + 16 * y_stride, y_bytes);
      _tile_stored(3, out + 16 * y_stride + LANES, y_bytes);
    }
  }
}

torch::Tensor amx_matmul(const Weights& w, const torch::Tensor& x) {
  const int64_t m_rows = x.size(0), k = w.k, padded_rows = (m_rows + 15) / 16 * 16, padded = w.tiles * TILE;
  torch::Tensor xb = torch::zeros({padded_rows, k}, x.options().dtype(torch::kBFloat16));
  xb.narrow(0, 0, m_rows).copy_(x);
  torch::Tensor y = torch::empty({padded_rows, padded}, x.options().dtype(torch::kFloat32));
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, w.tiles, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint32_t> vnni;  // 64 columns x K, in L2 (74 KB at K = 576)
    vnni.resize(std::max<size_t>(vnni.size(), k / 2 * TILE));
    configure_tiles();  // tile configuration is per thread
    for (int64_t t = begin; t < end; ++t) {
      decode_tile_vnni(w, t, vnni.data());
      int64_t m0 = 0;
      for (; m0 + 32 <= padded_rows; m0 += 32) amx_rows<true>(xp, k, m0, vnni.data(), yp + t * TILE, padded);
      if (m0 < padded_rows) amx_rows<false>(xp, k, m0, vnni.data(), yp + t * TILE, padded);
    }
    _tile_release();
  });
  return y.narrow(0, 0, m_rows).narrow(1, 0, w.n).to(x.scalar_type()).contiguous();
}
#endif

Weights checked_weights(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                        const torch::Tensor& offsets, int64_t group_size, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "x must be float32 or bfloat16");
  TORCH_CHECK(codes.scalar_type() == torch::kInt32 && codes.dim() == 3 && codes.size(2) == TILE &&
                  codes.is_contiguous(), "codes must be a contiguous int32 [tiles, K / 8, 64] tensor");
  const int64_t k = x.size(1), tiles = codes.size(0);
  TORCH_CHECK(codes.size(1) * 8 == k, "codes hold ", codes.size(1) * 8, " input rows, x has ", k);
  TORCH_CHECK(group_size % 8 == 0 && k % group_size == 0, "group size ", group_size,
              " must be a multiple of 8 that divides ", k);
  const int64_t groups = k / group_size;
  for (const auto* t : {&scales, &offsets})
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous() && t->dim() == 3 && t->size(0) == tiles &&
                    t->size(1) == groups && t->size(2) == TILE, "scales and offsets must be float32 [tiles, groups, 64]");
  TORCH_CHECK(n <= tiles * TILE && n > (tiles - 1) * TILE, "n = ", n, " does not fit ", tiles, " tiles");
  return Weights{codes.data_ptr<int32_t>(), scales.data_ptr<float>(), offsets.data_ptr<float>(), k, groups,
                 group_size, n, tiles};
}

torch::Tensor int4_gemv(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets,
                        int64_t group_size, int64_t n) {
  const Weights w = checked_weights(x, codes, scales, offsets, group_size, n);
  const int64_t m_rows = x.size(0), padded = w.tiles * TILE;
  const torch::Tensor xf = x.to(torch::kFloat32).contiguous();
  const float* xp = xf.data_ptr<float>();
  // Per-group row sums, here rather than as torch ops: at one row each torch op costs more than the sum.
  std::vector<float> xsum(m_rows * w.groups, 0.0f);
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t g = 0; g < w.groups; ++g) {
      float total = 0.0f;
      for (int64_t i = 0; i < group_size; ++i) total += xp[m * w.k + g * group_size + i];
      xsum[m * w.groups + g] = total;
    }
  torch::Tensor y = torch::empty({m_rows, padded}, x.options().dtype(torch::kFloat32));
  const float* sp = xsum.data();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, w.tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) gemv(w, t, xp, sp, m_rows, yp + t * TILE, padded);
  });
  return n == padded && x.scalar_type() == torch::kFloat32 ? y : y.narrow(1, 0, n).to(x.scalar_type()).contiguous();
}

bool amx_available() {
#ifdef __AMX_BF16__
  return amx_usable();
#else
  return false;
#endif
}

torch::Tensor int4_amx(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets,
                       int64_t group_size, int64_t n) {
  const Weights w = checked_weights(x, codes, scales, offsets, group_size, n);
  TORCH_CHECK(amx_available(), "this CPU (or this build) has no AMX bf16");
  TORCH_CHECK(w.k % 32 == 0, "the AMX path needs an input size that is a multiple of 32, not ", w.k);
#ifdef __AMX_BF16__
  return amx_matmul(w, x);
#else
  return {};
#endif
}

torch::Tensor int4_blocks(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets,
                          int64_t group_size, int64_t n, int64_t block_tiles) {
  const Weights w = checked_weights(x, codes, scales, offsets, group_size, n);
  TORCH_CHECK(block_tiles > 0, "block_tiles must be positive");
  const int64_t k = w.k, padded = w.tiles * TILE, blocks = (w.tiles + block_tiles - 1) / block_tiles;
  torch::Tensor y = torch::empty({x.size(0), padded}, x.options());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    // Inside parallel_for torch runs each matmul on the calling thread: one block per thread at a time.
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * block_tiles, count = std::min(block_tiles, w.tiles - t0);
      // A buffer per thread, kept between calls: a fresh one would be mmap'ed and page-faulted every time.
      thread_local std::vector<float> storage;
      storage.resize(std::max<size_t>(storage.size(), k * count * TILE));
      torch::Tensor buffer = torch::from_blob(storage.data(), {k, count * TILE}, x.options());
      if (x.scalar_type() == torch::kFloat32) decode_tiles(w, t0, count, buffer.data_ptr<float>());
      else decode_tiles(w, t0, count, reinterpret_cast<uint16_t*>(buffer.data_ptr<at::BFloat16>()));
      y.narrow(1, t0 * TILE, count * TILE).copy_(torch::mm(x, buffer));
    }
  });
  return n == padded ? y : y.narrow(1, 0, n).contiguous();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_gemv", &int4_gemv, "INT4 GEMM for a few rows, decoded in registers");
  m.def("int4_amx", &int4_amx, "INT4 GEMM with AMX bf16 tiles over weights decoded per 64-column tile");
  m.def("int4_blocks", &int4_blocks, "INT4 GEMM: blocks of decoded weights multiplied by torch's matmul");
  m.def("amx_available", &amx_available, "whether int4_amx runs here");
}
