#include "model/vision_tower.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/block/norm.h"
#include "ops/attention/softmax_fast.h"

namespace cedar::model {
namespace {

constexpr float kVisionNormEps = 1e-6f;  // vision.py RMSNorm's default (the backbone's is 1e-20)

template <typename Fn>
void parallel_over_heads(ThreadPool* pool, size_t heads, Fn&& fn) {
  if (pool == nullptr) {
    fn(size_t{0}, heads);
  } else {
    pool->parallel_for(heads, 1, [&](size_t begin, size_t end, int) { fn(begin, end); });
  }
}

}  // namespace

const uint16_t* VisionTensorStore::bf16(const WeightMap& map, std::string_view name) {
  const io::TensorView& v = map.at(name);
  if (reinterpret_cast<uintptr_t>(v.data) % alignof(uint16_t) == 0) return reinterpret_cast<const uint16_t*>(v.data);
  auto copy = std::make_unique<std::vector<uint16_t>>(v.nbytes / 2);
  std::memcpy(copy->data(), v.data, v.nbytes);
  copies.push_back(std::move(copy));
  return copies.back()->data();
}

ops::Bf16Weight VisionTensorStore::linear(const WeightMap& map, const std::string& name) {
  const io::TensorView& v = map.at(name);
  return {bf16(map, name), static_cast<size_t>(v.shape[0]), static_cast<size_t>(v.shape[1])};
}

void vision_linear_bias(const ops::KernelSet& ks, const float* x, size_t m, const ops::Bf16Weight& w,
                        const uint16_t* bias, float* y, ThreadPool* pool) {
  ks.linear_bf16(x, m, w, y, ops::LinearOut::kF32, pool);
  for (size_t i = 0; i < m; ++i) {
    float* row = y + i * w.n;
    for (size_t j = 0; j < w.n; ++j) row[j] = ops::round_bf16(row[j] + ops::bf16_bits_to_f32(bias[j]));
  }
}

VisionRope VisionRope::make(int n_h, int n_w, int rope_dim, double theta) {
  // inv_freq = 1 / theta^(2i / rope_dim): the exponent in f32, the power correctly rounded, 1/x in f32.
  const int n_freq = rope_dim / 2;
  std::vector<float> inv_freq(n_freq);
  for (int i = 0; i < n_freq; ++i) {
    const float t = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    inv_freq[i] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(t)));
  }
  VisionRope rope;
  rope.rope_dim = rope_dim;
  const size_t n = static_cast<size_t>(n_h) * n_w;
  rope.cos.resize(n * rope_dim);
  rope.sin.resize(n * rope_dim);
  for (int r = 0; r < n_h; ++r) {
    for (int c = 0; c < n_w; ++c) {
      const size_t at = (static_cast<size_t>(r) * n_w + c) * rope_dim;
      for (int i = 0; i < n_freq; ++i) {
        const float row_angle = static_cast<float>(r) * inv_freq[i];
        const float col_angle = static_cast<float>(c) * inv_freq[i];
        rope.cos[at + i] = ops::cos_f32(row_angle);
        rope.sin[at + i] = ops::sin_f32(row_angle);
        rope.cos[at + n_freq + i] = ops::cos_f32(col_angle);
        rope.sin[at + n_freq + i] = ops::sin_f32(col_angle);
      }
    }
  }
  return rope;
}

VisionAttention::VisionAttention(const VisionConfig& c, const WeightMap& map, const std::string& p,
                                 VisionTensorStore* store)
    : dim_(c.dim),
      n_heads_(c.n_heads),
      head_dim_(c.dim / c.n_heads),
      wqkv_(store->linear(map, p + ".wqkv.weight")),
      wo_(store->linear(map, p + ".wo.weight")),
      wqkv_bias_(store->bf16(map, p + ".wqkv.bias")),
      wo_bias_(store->bf16(map, p + ".wo.bias")) {}

void VisionAttention::forward(const float* x, size_t n, const VisionRope& rope, float* out, const ops::KernelSet& ks,
                              ThreadPool* pool) const {
  const size_t d = static_cast<size_t>(dim_), hd = static_cast<size_t>(head_dim_), half = hd / 2;
  std::vector<float> qkv(n * 3 * d);
  vision_linear_bias(ks, x, n, wqkv_, wqkv_bias_, qkv.data(), pool);
  // apply_rotary on q and k, per head: [x1 c - x2 s, x2 c + x1 s] in f32, rounded to bf16.
  for (size_t i = 0; i < n; ++i) {
    const float* cs = rope.cos.data() + i * half;
    const float* sn = rope.sin.data() + i * half;
    for (int part = 0; part < 2; ++part) {
      for (int h = 0; h < n_heads_; ++h) {
        float* v = qkv.data() + i * 3 * d + part * d + h * hd;
        for (size_t j = 0; j < half; ++j) {
          const float x1 = v[j], x2 = v[j + half];
          v[j] = ops::round_bf16(x1 * cs[j] - x2 * sn[j]);
          v[j + half] = ops::round_bf16(x2 * cs[j] + x1 * sn[j]);
        }
      }
    }
  }
  std::vector<float> attended(n * d);
  if (ks.numerics == ops::Numerics::kFast) {
    attend_fast(qkv.data(), n, attended.data(), ks, pool);
  } else {
    attend_exact(qkv.data(), n, attended.data(), pool);
  }
  vision_linear_bias(ks, attended.data(), n, wo_, wo_bias_, out, pool);
}

// The golden's contract, one head per task: fp32 logits of exact dots, correctly rounded exp, float64
// sums, bf16 probabilities in the PV product.
void VisionAttention::attend_exact(const float* qkv, size_t n, float* attended, ThreadPool* pool) const {
  const size_t d = static_cast<size_t>(dim_), hd = static_cast<size_t>(head_dim_);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  auto one_head = [&](size_t h, std::vector<float>& logits) {
    for (size_t i = 0; i < n; ++i) {
      const float* q = qkv + i * 3 * d + h * hd;
      float max_logit = -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < n; ++j) {
        const float* k = qkv + j * 3 * d + d + h * hd;
        double dot = 0;
        for (size_t t = 0; t < hd; ++t) dot += static_cast<double>(q[t]) * k[t];
        logits[j] = static_cast<float>(dot) * scale;
        max_logit = std::max(max_logit, logits[j]);
      }
      double denominator = 0;
      for (size_t j = 0; j < n; ++j) {
        const float p = ops::exp_f32(logits[j] - max_logit);
        denominator += p;                // the fp32 probabilities feed the denominator,
        logits[j] = ops::round_bf16(p);  // their bf16 roundings the PV product
      }
      const float denom = static_cast<float>(denominator);
      float* o = attended + i * d + h * hd;
      for (size_t t = 0; t < hd; ++t) {
        double acc = 0;
        for (size_t j = 0; j < n; ++j) acc += static_cast<double>(logits[j]) * qkv[j * 3 * d + 2 * d + h * hd + t];
        o[t] = ops::round_bf16(static_cast<float>(acc) / denom);
      }
    }
  };
  parallel_over_heads(pool, static_cast<size_t>(n_heads_), [&](size_t begin, size_t end) {
    std::vector<float> logits(n);
    for (size_t h = begin; h < end; ++h) one_head(h, logits);
  });
}

// Fast numerics: per head, blocks of queries against all keys as two GEMMs of the kernel set
// (S = Q K^T, then O = P V with P in bf16, as in exact mode), softmax in fp32.
void VisionAttention::attend_fast(const float* qkv, size_t n, float* attended, const ops::KernelSet& ks,
                                  ThreadPool* pool) const {
  const size_t d = static_cast<size_t>(dim_), hd = static_cast<size_t>(head_dim_);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  constexpr size_t kQueryBlock = 128;
  parallel_over_heads(pool, static_cast<size_t>(n_heads_), [&](size_t begin, size_t end) {
    std::vector<uint16_t> k_bits(n * hd), vt_bits(hd * n);
    std::vector<float> q_block(kQueryBlock * hd), scores(kQueryBlock * n), o_block(kQueryBlock * hd);
    for (size_t h = begin; h < end; ++h) {
      for (size_t j = 0; j < n; ++j) {
        for (size_t t = 0; t < hd; ++t) {
          k_bits[j * hd + t] = ops::f32_to_bf16_bits(qkv[j * 3 * d + d + h * hd + t]);
          vt_bits[t * n + j] = ops::f32_to_bf16_bits(qkv[j * 3 * d + 2 * d + h * hd + t]);
        }
      }
      const ops::Bf16Weight keys{k_bits.data(), n, hd, nullptr}, values_t{vt_bits.data(), hd, n, nullptr};
      for (size_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const size_t rows = std::min(kQueryBlock, n - i0);
        for (size_t i = 0; i < rows; ++i) std::memcpy(&q_block[i * hd], qkv + (i0 + i) * 3 * d + h * hd, hd * 4);
        ks.linear_bf16(q_block.data(), rows, keys, scores.data(), ops::LinearOut::kF32, nullptr);
        std::vector<float> denominators(rows);
        // bf16 probabilities (as in exact mode): the PV GEMM then runs on the bf16 tile.
        for (size_t i = 0; i < rows; ++i) denominators[i] = ops::fast::softmax_row_bf16(&scores[i * n], n, scale);
        ks.linear_bf16(scores.data(), rows, values_t, o_block.data(), ops::LinearOut::kF32, nullptr);
        for (size_t i = 0; i < rows; ++i) {
          float* o = attended + (i0 + i) * d + h * hd;
          for (size_t t = 0; t < hd; ++t) o[t] = ops::round_bf16(o_block[i * hd + t] / denominators[i]);
        }
      }
    }
  });
}

VisionMlp::VisionMlp(const VisionConfig& c, const WeightMap& map, const std::string& p, VisionTensorStore* store)
    : inter_dim_(c.inter_dim), w1_(store->linear(map, p + ".w1.weight")), w2_(store->linear(map, p + ".w2.weight")) {}

void VisionMlp::forward(const float* x, size_t n, float* out, const ops::KernelSet& ks, ThreadPool* pool) const {
  const size_t inter = static_cast<size_t>(inter_dim_);
  std::vector<float> gate_up(n * 2 * inter), hidden(n * inter);
  ks.linear_bf16(x, n, w1_, gate_up.data(), ops::LinearOut::kBf16, pool);
  // F.silu(gate) * up on bf16 tensors: two roundings to bf16.
  for (size_t i = 0; i < n; ++i) {
    const float* g = gate_up.data() + i * 2 * inter;
    for (size_t j = 0; j < inter; ++j) {
      hidden[i * inter + j] = ops::round_bf16(ops::round_bf16(ops::silu_f32(g[j])) * g[inter + j]);
    }
  }
  ks.linear_bf16(hidden.data(), n, w2_, out, ops::LinearOut::kBf16, pool);
}

VisionBlock::VisionBlock(const VisionConfig& c, const WeightMap& map, const std::string& p, VisionTensorStore* store)
    : dim_(c.dim),
      norm1_(store->bf16(map, p + ".norm1.weight")),
      norm2_(store->bf16(map, p + ".norm2.weight")),
      attn_(c, map, p + ".attn", store),
      mlp_(c, map, p + ".mlp", store) {}

void VisionBlock::forward(float* x, size_t n, const VisionRope& rope, const ops::KernelSet& ks,
                          ThreadPool* pool) const {
  const size_t d = static_cast<size_t>(dim_);
  std::vector<float> normed(n * d), branch(n * d);
  ops::rms_norm(x, n, d, norm1_, kVisionNormEps, normed.data());
  attn_.forward(normed.data(), n, rope, branch.data(), ks, pool);
  for (size_t i = 0; i < n * d; ++i) x[i] = ops::round_bf16(x[i] + branch[i]);
  ops::rms_norm(x, n, d, norm2_, kVisionNormEps, normed.data());
  mlp_.forward(normed.data(), n, branch.data(), ks, pool);
  for (size_t i = 0; i < n * d; ++i) x[i] = ops::round_bf16(x[i] + branch[i]);
}

Result<std::unique_ptr<VisionTower>> VisionTower::bind(const ModelConfig& config, const WeightMap& map) {
  const VisionConfig& v = config.vision;
  if (!v.present || v.n_layers <= 0) {
    return failed_precondition(
        "this checkpoint has no vision tower (config.json has no vision_config); it cannot "
        "read images");
  }
  if (v.n_heads <= 0 || v.dim % v.n_heads != 0 || (v.dim / v.n_heads) % 4 != 0) {
    return invalid_argument("vision_config: hidden_size " + std::to_string(v.dim) + " must split into " +
                            std::to_string(v.n_heads) + " heads of a multiple of 4 (2D RoPE halves)");
  }
  std::unique_ptr<VisionTower> tower(new VisionTower(v));
  tower->patch_embed_ = tower->store_.linear(map, "vision.patch_embed.proj.weight");
  tower->patch_embed_bias_ = tower->store_.bf16(map, "vision.patch_embed.proj.bias");
  tower->blocks_.reserve(v.n_layers);
  for (int b = 0; b < v.n_layers; ++b) {
    tower->blocks_.emplace_back(v, map, "vision.blocks." + std::to_string(b), &tower->store_);
  }
  tower->norm_ = tower->store_.bf16(map, "vision.norm.weight");
  return tower;
}

std::vector<float> VisionTower::forward(std::span<const uint16_t> patches, int n_h, int n_w, const ops::KernelSet& ks,
                                        ThreadPool* pool, const Observer& observe) const {
  const size_t n = static_cast<size_t>(n_h) * n_w, d = static_cast<size_t>(config_.dim);
  const size_t patch_len = patch_embed_.k;
  CEDAR_CHECK(patches.size() == n * patch_len, "VisionTower::forward: patches do not match the grid");
  std::vector<float> input(patches.size());
  for (size_t i = 0; i < patches.size(); ++i) input[i] = ops::bf16_bits_to_f32(patches[i]);
  std::vector<float> x(n * d);
  vision_linear_bias(ks, input.data(), n, patch_embed_, patch_embed_bias_, x.data(), pool);
  if (observe) observe("patch_embed", x);
  const VisionRope rope = VisionRope::make(n_h, n_w, config_.dim / config_.n_heads / 2, config_.rope_theta);
  for (size_t b = 0; b < blocks_.size(); ++b) {
    blocks_[b].forward(x.data(), n, rope, ks, pool);
    if (observe) observe("block" + std::to_string(b), x);
  }
  ops::rms_norm(x.data(), n, d, norm_, kVisionNormEps, x.data());
  if (observe) observe("norm", x);
  return x;
}

}  // namespace cedar::model
