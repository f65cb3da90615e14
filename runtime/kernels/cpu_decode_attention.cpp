// Paged decode attention on CPU: one query per sequence, read straight from the paged KV cache.
//
// The torch reference gathers every sequence's blocks into a padded [B, L, kv_heads, D] copy per layer and
// runs a masked SDPA over it; at decode that copy, not the arithmetic, is most of the time. This kernel
// walks each sequence's block table in place. Caches are float32, or uint8 bytes of float8_e4m3fn decoded
// through a 256-entry table (value = fp8 * scale, the compressed-tensors / vLLM convention).
//
//   q            [B, heads, D] float32
//   k/v_cache    [slots, kv_heads, D] float32 or uint8, slot = block_id * block_size + offset
//   block_tables [B, max_blocks] int64;  context_lens [B] int64
//   fp8_table    [256] float32 (empty for float32 caches)
//   returns      [B, heads, D] float32

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// A cached K or V row as float32: in place for a float32 cache, decoded into `buffer` for fp8 bytes.
inline const float* row(const float* cached, const float*, float, int64_t, float*) { return cached; }
inline const float* row(const uint8_t* cached, const float* fp8_table, float scale, int64_t dim, float* buffer) {
  for (int64_t d = 0; d < dim; ++d) buffer[d] = fp8_table[cached[d]] * scale;
  return buffer;
}

template <typename CacheT>
void decode(const float* q, const CacheT* k_cache, const CacheT* v_cache, const int64_t* tables,
            const int64_t* lens, const float* fp8_table, float* out, int64_t batch, int64_t heads,
            int64_t kv_heads, int64_t dim, int64_t max_blocks, int64_t block_size, float scale, float k_scale,
            float v_scale) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * dim);
    std::vector<float> krow(dim), vrow(dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kvh = task % kv_heads, len = lens[b];
      const float* qb = q + (b * heads + kvh * group) * dim;  // this KV head's query heads, contiguous
      scores.assign(group * len, 0.f);
      // Pass 1: scores of every query head of the group against every cached key.
      for (int64_t t = 0; t < len; ++t) {
        const int64_t slot = tables[b * max_blocks + t / block_size] * block_size + t % block_size;
        const float* key = row(k_cache + (slot * kv_heads + kvh) * dim, fp8_table, k_scale, dim, krow.data());
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = qb + g * dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < dim; ++d) s += qg[d] * key[d];
          scores[g * len + t] = s * scale;
        }
      }
      // Softmax per query head, in float32.
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        const float m = *std::max_element(s, s + len);
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - m));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) s[t] *= inv;
      }
      // Pass 2: probability-weighted values.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t slot = tables[b * max_blocks + t / block_size] * block_size + t % block_size;
        const float* value = row(v_cache + (slot * kv_heads + kvh) * dim, fp8_table, v_scale, dim, vrow.data());
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + t];
          float* a = acc.data() + g * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) a[d] += p * value[d];
        }
      }
      std::copy(acc.begin(), acc.end(), out + (b * heads + kvh * group) * dim);
    }
  });
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens,
                                     torch::Tensor fp8_table, int64_t block_size, double scale, double k_scale,
                                     double v_scale) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), max_blocks = block_tables.size(1);
  auto out = torch::empty_like(q);
  if (k_cache.scalar_type() == torch::kFloat) {
    decode<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                  block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(), nullptr,
                  out.data_ptr<float>(), batch, heads, kv_heads, dim, max_blocks, block_size, scale, 1.f, 1.f);
  } else {
    decode<uint8_t>(q.data_ptr<float>(), k_cache.data_ptr<uint8_t>(), v_cache.data_ptr<uint8_t>(),
                    block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
                    fp8_table.data_ptr<float>(), out.data_ptr<float>(), batch, heads, kv_heads, dim, max_blocks,
                    block_size, scale, k_scale, v_scale);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention over a float32 or fp8 KV cache");
}
