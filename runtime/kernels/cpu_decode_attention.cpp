// Paged decode attention on CPU: one query per sequence, read straight from the paged KV cache.
//
// The torch reference gathers every sequence's blocks into a padded [B, L, kv_heads, D] copy per layer and
// runs a masked SDPA over it; at decode that copy, not the arithmetic, is most of the time. This kernel
// walks each sequence's block table in place. Caches are float32, bfloat16 (widened to float32 as each
// vector is loaded), or uint8 bytes of float8_e4m3fn decoded through a 256-entry table (value = fp8 * scale,
// the compressed-tensors / vLLM convention). All arithmetic is float32.
//
// One task per sequence. Its cached rows are located once (an fp8 sequence is decoded once into a float
// buffer), then streamed token by token: each row is read once for all query heads. Head dimensions 64
// and 128 use explicit 16-float vectors (left to itself, GCC vectorized the token loop with gathers,
// slower than scalar code); other sizes take plain loops.
//
//   q            [B, heads, D] float32 (the Python wrapper widens bf16 queries and narrows the output back)
//   k/v_cache    [slots, kv_heads, D] float32, bfloat16 or uint8, slot = block_id * block_size + offset
//   block_tables [B, max_blocks] int64;  context_lens [B] int64
//   fp8_table    [256] float32 (empty unless the cache is fp8)
//   returns      [B, heads, D] float32

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

struct Args {
  const float* q;
  const int64_t* tables;
  const int64_t* lens;
  const float* fp8_table;
  float* out;
  int64_t batch, heads, kv_heads, dim, max_blocks, block_size;
  float scale, k_scale, v_scale;
};

// Rows are read in the cache's own type where a load can widen them (float32, bfloat16 as uint16 bits);
// fp8 rows are decoded to float32 once per sequence through the 256-entry table.
template <typename CacheT> struct RowOf { using type = CacheT; };
template <> struct RowOf<uint8_t> { using type = float; };

// Per-task scratch, reused across sequences.
template <typename Row>
struct Scratch {
  std::vector<const Row*> keys, values;  // row of token t (KV head 0; heads follow at dim strides)
  std::vector<float> scores, totals, k_decoded, v_decoded;
  std::vector<int64_t> offsets;  // each query head's KV head, as an offset into a cached row

  explicit Scratch(const Args& a) : offsets(a.heads) {
    for (int64_t h = 0; h < a.heads; ++h) offsets[h] = (h / (a.heads / a.kv_heads)) * a.dim;
  }
};

// Where each of the sequence's tokens lives in the cache itself (float32, bfloat16).
template <typename T>
void locate_rows(const Args& a, const T* cache, int64_t b, std::vector<const T*>& rows, std::vector<float>&, float) {
  const int64_t width = a.kv_heads * a.dim, bs = a.block_size, len = a.lens[b];
  const int64_t* table = a.tables + b * a.max_blocks;
  rows.resize(len);
  for (int64_t t = 0; t < len; ++t) rows[t] = cache + (table[t / bs] * bs + t % bs) * width;
}

// fp8 (uint8 bytes): the sequence's rows decoded into `decoded`, value = fp8 * scale.
void locate_rows(const Args& a, const uint8_t* cache, int64_t b, std::vector<const float*>& rows,
                 std::vector<float>& decoded, float scale) {
  const int64_t width = a.kv_heads * a.dim, bs = a.block_size, len = a.lens[b];
  const int64_t* table = a.tables + b * a.max_blocks;
  rows.resize(len);
  decoded.resize(len * width);
  for (int64_t t = 0; t < len; ++t) {
    const uint8_t* cached = cache + (table[t / bs] * bs + t % bs) * width;
    float* row = decoded.data() + t * width;
    for (int64_t i = 0; i < width; ++i) row[i] = a.fp8_table[cached[i]] * scale;
    rows[t] = row;
  }
}

// Sixteen floats as one vector (GCC/Clang vector extensions: one AVX-512 register, or two AVX ones).
constexpr int kLanes = 16;
typedef float Vec __attribute__((vector_size(4 * kLanes)));
typedef uint32_t UVec __attribute__((vector_size(4 * kLanes)));
typedef uint16_t Bf16Vec __attribute__((vector_size(2 * kLanes)));

inline Vec load(const float* p) { Vec v; std::memcpy(&v, p, sizeof v); return v; }
// bfloat16 is the top half of a float32: widening is a shift.
inline Vec load(const uint16_t* p) {
  Bf16Vec bits;
  std::memcpy(&bits, p, sizeof bits);
  return (Vec)(__builtin_convertvector(bits, UVec) << 16);
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
inline float widen(float v) { return v; }
inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(float));
  return value;
}
// A pairwise tree (GCC turns the plain loop into a chain of 16 scalar adds, the hot spot of the QK loop).
typedef float Half __attribute__((vector_size(32)));
typedef float Quarter __attribute__((vector_size(16)));
inline float lane_sum(Vec v) {
  Half lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  const Half h = lo + hi;
  Quarter a, b;
  std::memcpy(&a, &h, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&h) + sizeof a, sizeof b);
  const Quarter q = a + b;
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// kVectors > 0: the head dimension is 16 * kVectors (explicit vectors); 0: any dimension, plain loops.
template <int kVectors, typename Row>
inline float dot(const float* x, const Row* y, int64_t dim) {
  if constexpr (kVectors > 0) {
    Vec acc = load(x) * load(y);
    for (int i = 1; i < kVectors; ++i) acc += load(x + kLanes * i) * load(y + kLanes * i);
    return lane_sum(acc);
  } else {
    float acc = 0.f;
    for (int64_t d = 0; d < dim; ++d) acc += x[d] * widen(y[d]);
    return acc;
  }
}

template <int kVectors, typename Row>
inline void add_scaled(float* acc, float p, const Row* v, int64_t dim) {
  if constexpr (kVectors > 0) {
    for (int i = 0; i < kVectors; ++i) store(acc + kLanes * i, load(acc + kLanes * i) + p * load(v + kLanes * i));
  } else {
    for (int64_t d = 0; d < dim; ++d) acc[d] += p * widen(v[d]);
  }
}

constexpr int64_t kAhead = 4;
template <typename Row>
inline void prefetch_row(const Row* row, int64_t width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < width * static_cast<int64_t>(sizeof(Row)); i += 64) __builtin_prefetch(bytes + i);
}

// Token by token, each cached row (every KV head) is read once, in order, for all query heads: the
// cache is streamed from memory, which bounds this kernel, and the query heads' dot products are
// independent work for the core to overlap.
template <typename CacheT, int kVectors>
void decode_sequence(const Args& a, const CacheT* k_cache, const CacheT* v_cache, int64_t b,
                     Scratch<typename RowOf<CacheT>::type>& w) {
  const int64_t dim = a.dim, heads = a.heads, len = a.lens[b];
  locate_rows(a, k_cache, b, w.keys, w.k_decoded, a.k_scale);
  locate_rows(a, v_cache, b, w.values, w.v_decoded, a.v_scale);
  w.scores.resize(heads * len);  // [head, token]: each head's softmax runs over contiguous scores
  const int64_t* offset = w.offsets.data();
  const float* q = a.q + b * heads * dim;
  float* s = w.scores.data();
  const int64_t width = a.kv_heads * dim, group = heads / a.kv_heads;
  for (int64_t t = 0; t < len; ++t) {
    if (t + kAhead < len) prefetch_row(w.keys[t + kAhead], width);
    if constexpr (kVectors > 0) {
      // Each KV head's key is loaded (and widened) once for the query heads that share it.
      for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh) {
        Vec key[kVectors];
        for (int i = 0; i < kVectors; ++i) key[i] = load(w.keys[t] + kvh * dim + kLanes * i);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          Vec acc = load(q + h * dim) * key[0];
          for (int i = 1; i < kVectors; ++i) acc += load(q + h * dim + kLanes * i) * key[i];
          s[h * len + t] = lane_sum(acc) * a.scale;
        }
      }
    } else {
      for (int64_t h = 0; h < heads; ++h) s[h * len + t] = dot<0>(q + h * dim, w.keys[t] + offset[h], dim) * a.scale;
    }
  }
  // Softmax per head in float32 (exp vectorized over tokens); 1 / sum is applied to the output at the end.
  std::vector<float>& total = w.totals;
  total.assign(heads, 0.f);
  for (int64_t h = 0; h < heads; ++h) {
    float* row = s + h * len;
    float m = row[0], sum = 0.f;
    for (int64_t t = 1; t < len; ++t) m = std::max(m, row[t]);
    for (int64_t t = 0; t < len; ++t) row[t] = std::exp(row[t] - m);
    for (int64_t t = 0; t < len; ++t) sum += row[t];
    total[h] = sum;
  }
  float* out = a.out + b * heads * dim;
  std::fill(out, out + heads * dim, 0.f);
  for (int64_t t = 0; t < len; ++t) {
    if (t + kAhead < len) prefetch_row(w.values[t + kAhead], width);
    if constexpr (kVectors > 0) {
      for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh) {
        Vec value[kVectors];
        for (int i = 0; i < kVectors; ++i) value[i] = load(w.values[t] + kvh * dim + kLanes * i);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          const float p = s[h * len + t];
          for (int i = 0; i < kVectors; ++i) store(out + h * dim + kLanes * i, load(out + h * dim + kLanes * i) + p * value[i]);
        }
      }
    } else {
      for (int64_t h = 0; h < heads; ++h) add_scaled<0>(out + h * dim, s[h * len + t], w.values[t] + offset[h], dim);
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float inv = 1.f / total[h];
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] *= inv;
  }
}

template <typename CacheT, int kVectors>
void decode(const Args& a, const CacheT* k_cache, const CacheT* v_cache) {
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    Scratch<typename RowOf<CacheT>::type> scratch(a);
    for (int64_t b = begin; b < end; ++b) decode_sequence<CacheT, kVectors>(a, k_cache, v_cache, b, scratch);
  });
}

template <typename CacheT>
void decode_any_dim(const Args& a, const CacheT* k_cache, const CacheT* v_cache) {
  switch (a.dim) {
    case 64: return decode<CacheT, 64 / kLanes>(a, k_cache, v_cache);
    case 128: return decode<CacheT, 128 / kLanes>(a, k_cache, v_cache);
    default: return decode<CacheT, 0>(a, k_cache, v_cache);
  }
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens,
                                     torch::Tensor fp8_table, int64_t block_size, double scale, double k_scale,
                                     double v_scale) {
  auto out = torch::empty_like(q);
  const bool fp8 = k_cache.scalar_type() == torch::kByte;
  Args a{q.data_ptr<float>(), block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
         fp8 ? fp8_table.data_ptr<float>() : nullptr, out.data_ptr<float>(), q.size(0), q.size(1),
         k_cache.size(1), q.size(2), block_tables.size(1), block_size, static_cast<float>(scale),
         fp8 ? static_cast<float>(k_scale) : 1.f, fp8 ? static_cast<float>(v_scale) : 1.f};
  if (fp8) {
    decode_any_dim<uint8_t>(a, k_cache.data_ptr<uint8_t>(), v_cache.data_ptr<uint8_t>());
  } else if (k_cache.scalar_type() == torch::kBFloat16) {
    decode_any_dim<uint16_t>(a, reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
                             reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()));
  } else {
    decode_any_dim<float>(a, k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention over a float32 or fp8 KV cache");
}
