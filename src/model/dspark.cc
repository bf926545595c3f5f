// The DSpark draft forward (docs/DSPARK.md). It reads like the official classes: DSparkAttention,
// DSparkBlock (Block.forward with mHC around attention and MoE), DSparkMarkovHead and
// DSparkConfidenceHead, tied together by DraftHead as Transformer.forward_spec ties the stages. Every
// op is the backbone's, through the model's kernel set, in the backbone's order of operations.
#include "model/dspark.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/mhc_mixes.h"
#include "model/model.h"
#include "ops/attention/attention.h"
#include "ops/formats/formats.h"
#include "ops/block/hc.h"
#include "ops/linear/linear.h"
#include "ops/block/moe.h"
#include "ops/block/norm.h"
#include "ops/formats/quant.h"

namespace cedar::model {
namespace {

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// A grown scratch vector as a span (the activation scratch of the FP8/FP4 linears).
std::span<float> grow_span(std::vector<float>& v, size_t n) {
  grow(v, n);
  return {v.data(), v.size()};
}

// Scratch of one draft call; grows to the block's size once, then no allocation.
struct DraftScratch {
  std::vector<float> act, streams, residual, x, y, mixes, pre_mix, attn_pre, post, comb;
  std::vector<float> qr, q, kv, o, window, group_in, group_out, wo_in;
  std::vector<float> router, row_w, expert_w, expert_x, expert_g, expert_u, expert_y, acc, shared_g, shared_u, shared_y;
  std::vector<int32_t> expert_ids, idx, rows;
  std::vector<float> hidden, main_x, main_kv, markov_bias, head_in, confidence_in;
};

// DSparkAttention: window-only MQA whose window holds the backbone's main KV, queried by a block of
// draft rows that also see each other's keys.
class DSparkAttention {
 public:
  DSparkAttention(const ModelConfig& c, const AttentionWeights& w, const ops::RopeTable& rope)
      : c_(c), w_(w), rope_(rope) {}

  // main_kv = fp8_qdq(rope(kv_norm(wkv(main_x)))) of n rows at positions p0.. (prefill seeding and the
  // decode path's ring write compute exactly this per row).
  void main_kv(const ops::KernelSet& k, const float* main_x, size_t n, int64_t p0, float* out, DraftScratch& s,
               ThreadPool* pool) const {
    const size_t hd = c_.head_dim;
    std::span<float> act = grow_span(s.act, k.act_scratch_floats(n, c_.dim));
    k.linear_fp8(main_x, n, w_.wkv, out, act, pool);
    ops::rms_norm(out, n, hd, w_.kv_norm, static_cast<float>(c_.norm_eps), out);
    ops::apply_rope(rope_, out, n, 1, hd, p0);
    ops::act_qdq_fp8_inplace(out, n * hd);
  }

  // The decode path for the block x [B, dim] (attn_norm'd) at positions p + 1 .. p + B, attending the
  // ring's filled slots (window rows in reference slot order, `window` [n_window, head_dim]) and all
  // B draft keys. out [B, dim].
  void forward(const ops::KernelSet& k, const float* x, size_t B, int64_t p, const float* window, size_t n_window,
               float* out, DraftScratch& s, ThreadPool* pool) const {
    const size_t H = c_.n_heads, hd = c_.head_dim, ql = c_.q_lora_rank, dim = c_.dim;
    const float eps = static_cast<float>(c_.norm_eps);
    const size_t G = c_.o_groups, K = H * hd / G, R = c_.o_lora_rank;
    std::span<float> act = grow_span(s.act, k.act_scratch_floats(B, std::max({dim, ql, G * R})));
    float* qr = grow(s.qr, B * ql);
    float* q = grow(s.q, B * H * hd);
    float* kv = grow(s.kv, B * hd);
    k.linear_fp8(x, B, w_.wq_a, qr, act, pool);
    ops::rms_norm(qr, B, ql, w_.q_norm, eps, qr);
    k.linear_fp8(qr, B, w_.wq_b, q, act, pool);
    ops::apply_rope(rope_, q, B, H, hd, p + 1);
    k.linear_fp8(x, B, w_.wkv, kv, act, pool);
    ops::rms_norm(kv, B, hd, w_.kv_norm, eps, kv);
    ops::apply_rope(rope_, kv, B, 1, hd, p + 1);
    ops::act_qdq_fp8_inplace(kv, B * hd);
    // get_dspark_topk_idxs: the window rows, then every draft row (no causal mask inside the block).
    const size_t n_idx = n_window + B;
    int32_t* idx = grow(s.idx, n_idx);
    for (size_t i = 0; i < n_idx; ++i) idx[i] = static_cast<int32_t>(i);
    const ops::KvRows rows{window, n_window, kv, B};
    const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
    float* o = grow(s.o, B * H * hd);
    for (size_t t = 0; t < B; ++t)
      k.sparse_attn(q + t * H * hd, H, hd, rows, w_.attn_sink, idx, n_idx, scale, o + t * H * hd, pool);
    ops::apply_rope(rope_, o, B, H, hd, p + 1, 1, ops::RopeDirection::kInverse);
    // Grouped wo_a (the FP8 weight read as bf16), then wo_b.
    float* gin = grow(s.group_in, B * K);
    float* gout = grow(s.group_out, B * R);
    float* wo_in = grow(s.wo_in, B * G * R);
    for (size_t g = 0; g < G; ++g) {
      for (size_t t = 0; t < B; ++t) std::memcpy(gin + t * K, o + t * H * hd + g * K, K * sizeof(float));
      const ops::Fp8Weight wg{w_.wo_a.codes + g * R * K, w_.wo_a.scales + (g * R / 32) * (K / 32), R, K};
      const ops::Fp8LinearJob job{ops::Fp8LinearJob::Kind::kAsBf16, ops::PreparedActivations::unquantized(gin, B, K),
                                  wg, gout};
      ops::fp8_linear_batch(k, {&job, 1}, pool);
      for (size_t t = 0; t < B; ++t) std::memcpy(wo_in + t * G * R + g * R, gout + t * R, R * sizeof(float));
    }
    k.linear_fp8(wo_in, B, w_.wo_b, out, act, pool);
  }

 private:
  const ModelConfig& c_;
  const AttentionWeights& w_;
  const ops::RopeTable& rope_;
};

// DSparkBlock (decode): Block.forward around DSparkAttention and the stages' MoE.
class DSparkBlock {
 public:
  DSparkBlock(const ModelConfig& c, const BlockWeights& w, const LayerPlanEntry& e, const ops::RopeTable& rope)
      : c_(c), w_(w), e_(e), attn_(c, w.attn, rope) {}

  const DSparkAttention& attention() const { return attn_; }

  // streams [B, hc, dim] and pre_mix [B, hc] in, out (in s.streams / s.pre_mix).
  void forward(const ops::KernelSet& k, size_t B, int64_t p, const float* window, size_t n_window, DraftScratch& s,
               ThreadPool* pool) const {
    const size_t dim = c_.dim, hc = c_.hc_mult, hc_dim = hc * dim, n_mix = (2 + hc) * hc;
    const float eps = static_cast<float>(c_.norm_eps);
    float* mixes = grow(s.mixes, B * n_mix);
    float* attn_pre = grow(s.attn_pre, B * hc);
    float* post = grow(s.post, B * hc);
    float* comb = grow(s.comb, B * hc * hc);
    float* x = grow(s.x, B * dim);
    float* y = grow(s.y, B * dim);
    grow(s.residual, B * hc_dim);
    // Attention sub-layer.
    std::swap(s.streams, s.residual);
    const float* R = s.residual.data();
    float* X = grow(s.streams, B * hc_dim);
    mhc_mixes(k, c_, R, B, w_.hc_attn_fn, w_.hc_attn_scale, w_.hc_attn_base, mixes, attn_pre, post, comb, pool);
    ops::hc_pre(R, s.pre_mix.data(), B, c_.hc_mult, dim, x);
    ops::rms_norm(x, B, dim, w_.attn_norm, eps, x);
    attn_.forward(k, x, B, p, window, n_window, y, s, pool);
    ops::hc_post(y, R, post, comb, B, c_.hc_mult, dim, X);
    // FFN sub-layer; its pre-mix is the next stage's (or the head's).
    std::swap(s.streams, s.residual);
    R = s.residual.data();
    X = s.streams.data();
    float* ffn_pre = s.pre_mix.data();
    mhc_mixes(k, c_, R, B, w_.hc_ffn_fn, w_.hc_ffn_scale, w_.hc_ffn_base, mixes, ffn_pre, post, comb, pool);
    ops::hc_pre(R, attn_pre, B, c_.hc_mult, dim, x);
    ops::rms_norm(x, B, dim, w_.ffn_norm, eps, x);
    moe(k, x, B, y, s, pool);
    ops::hc_post(y, R, post, comb, B, c_.hc_mult, dim, X);
  }

 private:
  // MoE with the stages' expert count: router, experts in ascending id order accumulated in fp32,
  // the shared expert last, bf16 out. Quantisation is per row, so each expert's rows run together.
  void moe(const ops::KernelSet& k, const float* x, size_t B, float* out, DraftScratch& s, ThreadPool* pool) const {
    const size_t dim = c_.dim, inter = c_.moe_inter_dim;
    const size_t E = e_.n_routed_experts, K = e_.n_activated_experts;
    const float limit = static_cast<float>(c_.swiglu_limit);
    std::span<float> act = grow_span(s.act, k.act_scratch_floats(B, std::max(dim, inter)));
    float* logits = grow(s.router, B * E);
    int32_t* ids = grow(s.expert_ids, B * K);
    float* wts = grow(s.expert_w, B * K);
    k.linear_bf16(x, B, w_.gate, logits, ops::LinearOut::kF32, pool);
    for (size_t t = 0; t < B; ++t)
      ops::route_sqrt_softplus(logits + t * E, w_.gate_bias, E, K, static_cast<float>(c_.route_scale), ids + t * K,
                               wts + t * K);
    float* acc = grow(s.acc, B * dim);
    std::memset(acc, 0, B * dim * sizeof(float));
    float* xe = grow(s.expert_x, B * dim);
    float* g = grow(s.expert_g, B * inter);
    float* u = grow(s.expert_u, B * inter);
    float* ye = grow(s.expert_y, B * dim);
    int32_t* rows = grow(s.rows, B);
    float* rw = grow(s.row_w, B);  // the routing weight of each of the current expert's rows
    for (size_t ex = 0; ex < E; ++ex) {
      size_t r = 0;
      for (size_t t = 0; t < B; ++t)
        for (size_t j = 0; j < K; ++j)
          if (ids[t * K + j] == static_cast<int32_t>(ex)) {
            rows[r] = static_cast<int32_t>(t);
            rw[r] = wts[t * K + j];
            std::memcpy(xe + r * dim, x + t * dim, dim * sizeof(float));
            ++r;
          }
      if (r == 0) continue;
      const ExpertWeights& we = w_.experts[ex];
      k.linear_fp4(xe, r, we.w1, g, act, pool);
      k.linear_fp4(xe, r, we.w3, u, act, pool);
      for (size_t i = 0; i < r; ++i) k.swiglu_clamped(g + i * inter, u + i * inter, inter, limit, rw[i], g + i * inter);
      k.linear_fp4(g, r, we.w2, ye, act, pool);
      for (size_t i = 0; i < r; ++i) {
        float* dst = acc + rows[i] * dim;
        for (size_t d = 0; d < dim; ++d) dst[d] += ye[i * dim + d];
      }
    }
    float* sg = grow(s.shared_g, B * inter);
    float* su = grow(s.shared_u, B * inter);
    k.linear_fp8(x, B, w_.shared.w1, sg, act, pool);
    k.linear_fp8(x, B, w_.shared.w3, su, act, pool);
    for (size_t t = 0; t < B; ++t) k.swiglu_clamped(sg + t * inter, su + t * inter, inter, limit, 1.0f, sg + t * inter);
    float* sy = grow(s.shared_y, B * dim);
    k.linear_fp8(sg, B, w_.shared.w2, sy, act, pool);
    for (size_t i = 0; i < B * dim; ++i) out[i] = ops::round_bf16(acc[i] + sy[i]);
  }

  const ModelConfig& c_;
  const BlockWeights& w_;
  const LayerPlanEntry& e_;
  DSparkAttention attn_;
};

// DSparkMarkovHead: a low-rank bigram bias, markov_head(markov_embed(previous token)), fp32.
class DSparkMarkovHead {
 public:
  DSparkMarkovHead(const ops::Bf16Weight& embed, const ops::Bf16Weight& head) : embed_(embed), head_(head) {}
  size_t rank() const { return embed_.k; }
  // embed [rank] (bf16 values) of `token`; bias [vocab] fp32.
  void forward(const ops::KernelSet& k, int32_t token, float* embed, float* bias, ThreadPool* pool) const {
    ops::bf16_to_f32(embed_.bits + static_cast<size_t>(token) * embed_.k, embed, embed_.k);
    k.linear_bf16(embed, 1, head_, bias, ops::LinearOut::kF32, pool);
  }

 private:
  const ops::Bf16Weight& embed_;
  const ops::Bf16Weight& head_;
};

// DSparkConfidenceHead: proj · fp32([hidden ; markov_embed]), one raw score per draft position.
class DSparkConfidenceHead {
 public:
  explicit DSparkConfidenceHead(const ops::Bf16Weight& proj) : proj_(proj) {}
  void forward(const ops::KernelSet& k, const float* joined, size_t B, float* out, ThreadPool* pool) const {
    k.linear_bf16(joined, B, proj_, out, ops::LinearOut::kF32, pool);
  }

 private:
  const ops::Bf16Weight& proj_;
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// The target-layer hook

void DsparkHook::configure(const ModelConfig& c, size_t capacity) {
  capacity_ = capacity;
  dim_ = c.dim;
  hc_ = c.hc_mult;
  width_ = c.dspark_target_layer_ids.size() * dim_;
  target_of_layer_.assign(c.n_layers, -1);
  for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i)
    target_of_layer_[c.dspark_target_layer_ids[i]] = static_cast<int>(i);
  if (capacity == 0) target_of_layer_.clear();
}

void DsparkHook::begin_forward(size_t n_chunks) {
  if (chunks_.size() < n_chunks) chunks_.resize(n_chunks);
  for (size_t i = 0; i < n_chunks; ++i) {
    grow(chunks_[i].rows, capacity_ * width_);
    chunks_[i].n = 0;
    chunks_[i].p0 = 0;
  }
  n_chunks_ = n_chunks;
  round_map_ = nullptr;
}

void DsparkHook::capture(int target, size_t round_chunk, int64_t p0, size_t n, const float* streams) {
  const size_t c = round_map_ ? (*round_map_)[round_chunk] : round_chunk;
  if (c >= n_chunks_ || n == 0) return;
  ChunkRows& cr = chunks_[c];
  const size_t keep = std::min(n, capacity_), skip = n - keep;
  if (target == 0) {              // the first target layer of a round adds its rows; later ones fill their columns
    if (cr.n == 0 || skip > 0) {  // (with skip > 0 the kept rows fill the capacity: older rows go)
      cr.n = 0;
      cr.p0 = p0 + static_cast<int64_t>(skip);
    } else if (cr.n + keep > capacity_) {
      const size_t drop = cr.n + keep - capacity_;
      std::memmove(cr.rows.data(), cr.rows.data() + drop * width_, (cr.n - drop) * width_ * sizeof(uint16_t));
      cr.n -= drop;
      cr.p0 += static_cast<int64_t>(drop);
    }
    cr.n += keep;
  }
  const float inv = 1.0f / static_cast<float>(hc_);
  for (size_t r = 0; r < keep; ++r) {
    const float* x = streams + (skip + r) * hc_ * dim_;
    uint16_t* dst = cr.rows.data() + (cr.n - keep + r) * width_ + static_cast<size_t>(target) * dim_;
    for (size_t d = 0; d < dim_; ++d) {
      float sum = x[d];
      for (size_t j = 1; j < hc_; ++j) sum += x[j * dim_ + d];
      dst[d] = ops::f32_to_bf16_bits(sum * inv);
    }
  }
}

DsparkHidden DsparkHook::hidden(size_t chunk) const {
  if (chunk >= n_chunks_) return {};
  return {chunks_[chunk].p0, chunks_[chunk].n, chunks_[chunk].rows.data()};
}

// ------------------------------------------------------------------------------------------------
// Draft state

Status DraftState::truncate(int64_t n, int window) {
  if (n > n_positions) return invalid_argument("draft state: cannot truncate forward");
  if (n < 0) return invalid_argument("draft state: negative length");
  const int64_t oldest_held = std::max(known_from, n_positions - static_cast<int64_t>(capacity));
  if (n > 0 && std::max<int64_t>(0, n - window) < oldest_held)
    return failed_precondition("draft state: rolling back to " + std::to_string(n) +
                               " positions needs KV of position " + std::to_string(std::max<int64_t>(0, n - window)) +
                               ", no longer held (at most " + std::to_string(capacity - window) +
                               " positions can be rolled back)");
  n_positions = n;
  if (n == 0) known_from = 0;
  return {};
}

// ------------------------------------------------------------------------------------------------
// DraftHead

struct DraftHead::Impl {
  const Model& m;
  const ModelConfig& c;
  const DsparkWeights& w;
  ops::RopeTable rope;  // ratio-0 layers: rope_theta, no YaRN
  std::vector<DSparkBlock> stages;
  DSparkMarkovHead markov;
  DSparkConfidenceHead confidence;
  DraftScratch s;

  Impl(const Model& model, const DsparkWeights& dw)
      : m(model),
        c(model.config()),
        w(dw),
        rope(c.rope_head_dim, c.rope_theta, std::nullopt,
             std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : 65536, 65536)),
        markov(dw.markov_embed, dw.markov_head),
        confidence(dw.confidence) {
    for (int st = 0; st < c.n_mtp_layers; ++st)
      stages.emplace_back(c, dw.stages[st], model.plan().layers[c.n_layers + st], rope);
  }
  size_t capacity() const { return static_cast<size_t>(c.window_size + c.dspark_block_size + 1); }
};

DraftHead::DraftHead(const Model& model) : impl_(std::make_unique<Impl>(model, *model.weights().dspark)) {}
DraftHead::~DraftHead() = default;

Result<std::unique_ptr<DraftHead>> DraftHead::create(const Model& model) {
  const ModelConfig& c = model.config();
  if (!model.weights().dspark || c.n_mtp_layers <= 0 || c.dspark_block_size <= 0) return std::unique_ptr<DraftHead>();
  if (c.dspark_block_size > kMaxDsparkBlockSize)
    return invalid_argument("DSpark: dspark_block_size " + std::to_string(c.dspark_block_size) + " exceeds " +
                            std::to_string(kMaxDsparkBlockSize));
  return std::unique_ptr<DraftHead>(new DraftHead(model));
}

const ModelConfig& DraftHead::config() const { return impl_->c; }
int DraftHead::block_size() const { return impl_->c.dspark_block_size; }
size_t DraftHead::state_capacity() const { return impl_->capacity(); }

DraftState DraftHead::new_state() const {
  DraftState st;
  st.capacity = impl_->capacity();
  st.rings.assign(impl_->stages.size(), std::vector<float>(st.capacity * impl_->c.head_dim, 0.0f));
  return st;
}

Status DraftHead::observe(DraftState& state, const DsparkHidden& h, ThreadPool* pool) {
  Impl& im = *impl_;
  const ModelConfig& c = im.c;
  if (state.rings.size() != im.stages.size() || state.capacity != im.capacity())
    return invalid_argument("DSpark observe: the draft state was not made by this draft head");
  if (h.n == 0) return {};
  if (!h.rows) return invalid_argument("DSpark observe: no hook rows (was the forward run with the draft head?)");
  const int64_t end = h.p0 + static_cast<int64_t>(h.n);
  if (end <= state.n_positions) return {};  // nothing new
  int64_t start = state.n_positions;
  if (h.p0 > state.n_positions) {  // a gap: only the positions from h.p0 on are known
    start = h.p0;
    state.known_from = h.p0;
  }
  const int64_t first = std::max(start, end - static_cast<int64_t>(state.capacity));
  const size_t n = static_cast<size_t>(end - first), hd = c.head_dim, dim = c.dim;
  const size_t width = c.dspark_target_layer_ids.size() * dim;
  float* hidden = grow(im.s.hidden, n * width);
  ops::bf16_to_f32(h.rows + static_cast<size_t>(first - h.p0) * width, hidden, n * width);
  const ops::KernelSet& k = im.m.kernels();
  // DSparkBlock.forward_embed: main_x = main_norm(main_proj(main_hidden)).
  float* main_x = grow(im.s.main_x, n * dim);
  std::span<float> act = grow_span(im.s.act, k.act_scratch_floats(n, width));
  k.linear_fp8(hidden, n, im.w.main_proj, main_x, act, pool);
  ops::rms_norm(main_x, n, dim, im.w.main_norm, static_cast<float>(c.norm_eps), main_x);
  float* kv = grow(im.s.main_kv, n * hd);
  for (size_t st = 0; st < im.stages.size(); ++st) {
    im.stages[st].attention().main_kv(k, main_x, n, first, kv, im.s, pool);
    for (size_t r = 0; r < n; ++r) {
      const size_t slot = static_cast<size_t>((first + static_cast<int64_t>(r)) % static_cast<int64_t>(state.capacity));
      std::memcpy(state.rings[st].data() + slot * hd, kv + r * hd, hd * sizeof(float));
    }
  }
  state.n_positions = end;
  if (first > start) state.known_from = std::max(state.known_from, first);  // [start, first) never reached the ring
  return {};
}

Status DraftHead::draft(const DraftState& state, int32_t token, const DraftOptions& options, DraftOutput* out,
                        ThreadPool* pool) {
  Impl& im = *impl_;
  const ModelConfig& c = im.c;
  DraftScratch& s = im.s;
  if (state.rings.size() != im.stages.size() || state.capacity != im.capacity())
    return invalid_argument("DSpark draft: the draft state was not made by this draft head");
  const int64_t p = state.n_positions - 1, win = c.window_size;
  if (p < 1)
    return failed_precondition(
        "DSpark draft: needs at least 2 observed positions (the reference drafts "
        "from start_pos > 0)");
  if (state.known_from > std::max<int64_t>(0, p + 1 - win))
    return failed_precondition("DSpark draft: the draft state lacks window positions (observe every forward)");
  const size_t vocab = c.vocab_size,
               sample_vocab = options.sample_vocab ? std::min(options.sample_vocab, vocab) : vocab;
  if (token < 0 || static_cast<size_t>(token) >= vocab)
    return invalid_argument("DSpark draft: token outside the vocabulary");
  if (options.temperature > 0 && !options.rng) return invalid_argument("DSpark draft: sampling needs an rng");
  const ops::KernelSet& k = im.m.kernels();
  const ModelWeights& mw = im.m.weights();
  const size_t B = c.dspark_block_size, dim = c.dim, hc = c.hc_mult, hd = c.head_dim, rank = im.markov.rank();

  const size_t n_window = static_cast<size_t>(std::min<int64_t>(win, p + 1));
  float* window = grow(s.window, n_window * hd);
  // forward_embed: [token, noise x (B-1)] embedded, 4 identical streams, one-hot pre-mix.
  float* X = grow(s.streams, B * hc * dim);
  float* pre = grow(s.pre_mix, B * hc);
  for (size_t t = 0; t < B; ++t) {
    const int32_t id = t == 0 ? token : c.dspark_noise_token_id;
    ops::bf16_to_f32(mw.embed.bits + static_cast<size_t>(id) * dim, X + t * hc * dim, dim);
    for (size_t j = 1; j < hc; ++j) std::memcpy(X + t * hc * dim + j * dim, X + t * hc * dim, dim * sizeof(float));
    for (size_t j = 0; j < hc; ++j) pre[t * hc + j] = j == 0 ? 1.0f : 0.0f;
  }
  for (size_t st = 0; st < im.stages.size(); ++st) {
    // The window rows in the reference's slot order (get_dspark_topk_idxs): slot j holds the newest
    // position q <= p with q mod window == j.
    for (size_t j = 0; j < n_window; ++j) {
      const int64_t q = p - ((p - static_cast<int64_t>(j)) % win);
      const size_t slot = static_cast<size_t>(q % static_cast<int64_t>(state.capacity));
      std::memcpy(window + j * hd, state.rings[st].data() + slot * hd, hd * sizeof(float));
    }
    im.stages[st].forward(k, B, p, window, n_window, s, pool);
  }
  // forward_head: collapse, norm, the shared head; then per position the Markov bias and the pick.
  out->ids.resize(B);
  out->logits.resize(B * vocab);
  out->confidence.resize(B);
  const size_t joined_w = dim + rank;
  float* joined = grow(s.confidence_in, B * joined_w);  // [B, dim + rank]: [x ; markov_embed]
  float* x = grow(s.head_in, B * dim);
  ops::hc_pre(s.streams.data(), s.pre_mix.data(), B, c.hc_mult, dim, x);
  for (size_t t = 0; t < B; ++t) std::memcpy(joined + t * joined_w, x + t * dim, dim * sizeof(float));
  ops::rms_norm(x, B, dim, im.w.norm, static_cast<float>(c.norm_eps), x);
  k.linear_bf16(x, B, mw.head, out->logits.data(), ops::LinearOut::kF32, pool);
  float* bias = grow(s.markov_bias, vocab);
  int32_t prev = token;
  for (size_t t = 0; t < B; ++t) {
    float* row = out->logits.data() + t * vocab;
    im.markov.forward(k, prev, joined + t * joined_w + dim, bias, pool);
    for (size_t v = 0; v < vocab; ++v) row[v] += bias[v];
    prev = options.temperature > 0 ? ops::sample_token(row, sample_vocab, options.temperature, *options.rng)
                                   : ops::argmax(row, sample_vocab);
    out->ids[t] = prev;
  }
  im.confidence.forward(k, joined, B, out->confidence.data(), pool);
  return {};
}

}  // namespace cedar::model
