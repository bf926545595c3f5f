// Registry cases of attention (ops/attention/attention.h): sparse attention with a sink (exact: bitwise equal to
// ref::sparse_attn; fast: attention_test.cc's derived bound) and the indexer's scores over FP4 keys
// (one kernel, bitwise equal to ref::indexer_scores on the float64 rows, the exact-spread rows and
// the integer key tiles).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "op_registry.h"
#include "ops/formats/formats.h"
#include "ops/attention/index_key_store.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"

namespace cedar::ops::testing {
namespace {

struct AttnShape {
  size_t heads, d, n_idx;
  bool released = false, perf_only = false;
};

// One query against a window segment (128 rows) and a compressed segment, n_idx indices of which
// about one in eight masked. Head 0's query is scaled by 2^7: its scores spread over hundreds, so
// many of its p round to zero while the other heads still use those rows.
class SparseAttn : public PreparedCase {
 public:
  SparseAttn(const AttnShape& s, const std::string& name, const PrepareOptions& opt) : s_(s) {
    Rng rng(seed_of(name.c_str()));
    q_ = random_bf16(s.heads * s.d, rng, 0.3f);
    for (size_t i = 0; i < s.d; ++i) q_[i] *= 128.0f;
    second_rows_ = std::max<size_t>(s.n_idx, 64);
    win_ = random_bf16(kWindow * s.d, rng);
    cmp_ = random_bf16(second_rows_ * s.d, rng);
    sink_.resize(s.heads);
    for (size_t h = 0; h < s.heads; ++h) sink_[h] = static_cast<float>(h % 8) - 3.0f;
    for (size_t i = 0; i < s.n_idx; ++i)
      idx_.push_back(rng.uniform_int(0, 7) == 0 ? -1
                                                : static_cast<int32_t>(rng.uniform_int(0, kWindow + second_rows_ - 1)));
    out = GuardedFloats(s.heads * s.d);
    if (!opt.reference) return;
    want.resize(s.heads * s.d);
    ref::sparse_attn(q_.data(), s.heads, s.d, kv(), sink_.data(), idx_.data(), s.n_idx, kScale, want.data());
    // |fast - exact| <= 2^-7 (Σ_j p_j |v_j[e]| / D + |exact|) + one bf16 ulp (attention_test.cc).
    fast_bound.resize(want.size());
    const KvRows rows = kv();
    for (size_t h = 0; h < s.heads; ++h) {
      std::vector<long double> sc(s.n_idx, -INFINITY);
      long double m = sink_[h];
      for (size_t j = 0; j < s.n_idx; ++j) {
        if (idx_[j] < 0) continue;
        const float* row = rows.row(static_cast<size_t>(idx_[j]), s.d);
        long double dot = 0;
        for (size_t i = 0; i < s.d; ++i) dot += static_cast<long double>(q_[h * s.d + i]) * row[i];
        sc[j] = dot * kScale;
        m = std::max(m, sc[j]);
      }
      long double den = std::exp(static_cast<long double>(sink_[h]) - m);
      std::vector<long double> mass(s.d, 0);
      for (size_t j = 0; j < s.n_idx; ++j) {
        if (idx_[j] < 0) continue;
        const long double p = std::exp(sc[j] - m);
        den += p;
        const float* row = rows.row(static_cast<size_t>(idx_[j]), s.d);
        for (size_t e = 0; e < s.d; ++e) mass[e] += p * std::fabs(row[e]);
      }
      for (size_t e = 0; e < s.d; ++e) {
        const double w = want[h * s.d + e];
        fast_bound[h * s.d + e] = 0x1p-7 * (static_cast<double>(mass[e] / den) + std::fabs(w)) + bf16_ulp(w) + 1e-30;
      }
    }
  }
  void run(const KernelSet& ks, ThreadPool* pool) override {
    ks.sparse_attn(q_.data(), s_.heads, s_.d, kv(), sink_.data(), idx_.data(), s_.n_idx, kScale, out.data(), pool);
  }

 private:
  static constexpr size_t kWindow = 128;
  static constexpr float kScale = 0.044194173f;  // 512^-0.5, the released softmax scale
  KvRows kv() const { return {win_.data(), kWindow, cmp_.data(), second_rows_}; }
  AttnShape s_;
  size_t second_rows_ = 0;
  std::vector<float> q_, win_, cmp_, sink_;
  std::vector<int32_t> idx_;
};

// The float64 rows alone, with the exact-sum spreads, with the integer key tiles, and through the
// kernel-owned IndexKeyStore the model holds (spreads and tiles, built from the FP4 entries).
enum class IndexPath { kRows, kSpread, kTiles, kStore };
const char* path_name(IndexPath p) {
  static const char* const names[] = {"rows", "spread", "tiles", "store"};
  return names[static_cast<int>(p)];
}

// One query's indexer scores over n_keys FP4 keys (scales 2^-3..2^0: mostly the fast paths), the
// query FP4 too, as the model's index q is. Key 5 is all zero codes.
class IndexerScores : public PreparedCase {
 public:
  IndexerScores(IndexPath path, size_t heads, size_t d, size_t n_keys, const std::string& name,
                const PrepareOptions& opt)
      : path_(path), heads_(heads), d_(d), n_keys_(n_keys) {
    Rng rng(seed_of(name.c_str()));
    std::vector<uint8_t> scales;
    const auto packed = random_packed_fp4(n_keys, d, rng, -3, 0, &scales, 5);
    keys_ = make_index_keys(packed, scales, n_keys, d);
    store_ = IndexKeyStore(d);
    std::vector<uint8_t> entry(store_.entry_bytes());
    for (size_t t = 0; t < n_keys; ++t) {  // entries as the KV owners hold them: codes, then scales
      std::memcpy(entry.data(), packed.data() + t * d / 2, d / 2);
      std::memcpy(entry.data() + d / 2, scales.data() + t * d / 32, d / 32);
      store_.append(entry.data(), 1);
    }
    q_ = random_fp4_rows(heads, d, rng, -3, 0);
    for (auto& x : q_) x = round_bf16(x);
    w_ = random_bf16(heads, rng, 0.05f);
    out = GuardedFloats(n_keys);
    if (!opt.reference) return;
    want.resize(n_keys);
    ref::indexer_scores(q_.data(), w_.data(), heads, d, keys_.rows.data(), n_keys, want.data());
  }
  void run(const KernelSet&, ThreadPool* pool) override {
    if (path_ == IndexPath::kStore) return store_.scores(q_.data(), w_.data(), heads_, n_keys_, out.data(), pool);
    const IndexKeyTiles tiles = keys_.tiles();
    indexer_scores(q_.data(), w_.data(), heads_, d_, keys_.rows.data(), n_keys_, out.data(), pool,
                   path_ == IndexPath::kRows ? nullptr : keys_.spread.data(),
                   path_ == IndexPath::kTiles ? &tiles : nullptr);
  }

 private:
  IndexPath path_;
  size_t heads_, d_, n_keys_;
  IndexKeys keys_;
  IndexKeyStore store_;
  std::vector<float> q_, w_;
};

// The indexer's top-k over bf16 scores as it leaves them: relu'd head sums, so many repeat (zeros
// above all). The output is the indices (as floats, exact below 2^24); the reference is a stable sort
// by descending score (the lower index wins ties), its first k indices in ascending order.
class TopK : public PreparedCase {
 public:
  TopK(size_t n, size_t k, int zeros_percent, const std::string& name, const PrepareOptions& opt) : n_(n), k_(k) {
    Rng rng(seed_of(name.c_str()));
    scores_.resize(n);
    for (auto& v : scores_) v = rng.uniform_int(0, 99) < zeros_percent ? 0.0f : round_bf16(std::fabs(rng.normal()));
    idx_.resize(k);
    scratch_.resize(n);
    out = GuardedFloats(k);
    if (!opt.reference) return;
    std::vector<int32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores_[a] > scores_[b]; });
    order.resize(k);
    std::sort(order.begin(), order.end());
    want.assign(order.begin(), order.end());
  }
  void run(const KernelSet&, ThreadPool*) override {
    topk_ascending(scores_.data(), n_, k_, idx_.data(), scratch_.data());
    for (size_t i = 0; i < k_; ++i) out.data()[i] = static_cast<float>(idx_[i]);
  }

 private:
  size_t n_, k_;
  std::vector<float> scores_;
  std::vector<int32_t> idx_, scratch_;
};

}  // namespace

void add_attention_cases(std::vector<OpCase>& cases) {
  // Head dims with a tail (100), the released one (512) and small ones; head counts that fill the
  // kernel's head groups and leave shorter ones (13 = 8 + 5, 3). Released: 64 heads of 512 over the
  // 128-row window and 512 compressed rows.
  for (const AttnShape& s : std::initializer_list<AttnShape>{{8, 64, 300},
                                                             {13, 512, 300},
                                                             {3, 100, 300},
                                                             {8, 512, 70},
                                                             {64, 512, 640, true},
                                                             {64, 512, 1152, true, true}}) {
    add_case<SparseAttn>(
        cases,
        {.name = "sparse_attn heads=" + std::to_string(s.heads) + " d=" + std::to_string(s.d) +
                 " idx=" + std::to_string(s.n_idx),
         .op = "sparse_attn",
         .numerics = {Numerics::kExact, Numerics::kFast},
         .released = s.released,
         .perf_only = s.perf_only,
         .bound = "exact: bitwise = ref::sparse_attn; fast: 2^-7*(sum_j p_j|v_j|/D + |want|) + bf16 ulp",
         .bytes = 4.0 * (s.n_idx * s.d + 2.0 * s.heads * s.d) + 4.0 * s.n_idx,
         .flops = 4.0 * s.heads * s.n_idx * s.d},  // q·k and p·v
        s);
  }
  struct IndexShape {
    size_t heads, d, n_keys;
    bool released = false, perf_only = false;
  };
  // n_keys not a multiple of the 16-key tile; released: 32 heads of 128 (index_n_heads, index_head_dim).
  for (const IndexShape& s : std::initializer_list<IndexShape>{
           {16, 32, 300}, {16, 128, 293}, {32, 128, 1024, true}, {32, 128, 65536, true, true}}) {
    for (IndexPath path : {IndexPath::kRows, IndexPath::kSpread, IndexPath::kTiles, IndexPath::kStore}) {
      const bool tiles = path == IndexPath::kTiles || path == IndexPath::kStore;
      const double key_bytes = tiles ? s.d + s.d / 32 * 8.0 : 4.0 * s.d;
      add_case<IndexerScores>(
          cases,
          {.name = std::string("indexer_scores path=") + path_name(path) + " heads=" + std::to_string(s.heads) +
                   " d=" + std::to_string(s.d) + " keys=" + std::to_string(s.n_keys),
           .op = "indexer_scores",
           .numerics = {Numerics::kExact},  // one kernel (not in the kernel set)
           .reach = tiles ? uint32_t{kReachIndexTiles} : 0u,
           .released = s.released,
           .perf_only = s.perf_only,
           .bound = "bitwise = ref::indexer_scores",
           .bytes = key_bytes * s.n_keys + 4.0 * s.heads * s.d + 4.0 * s.n_keys,
           .flops = 2.0 * s.heads * s.d * s.n_keys},
          path, s.heads, s.d, s.n_keys);
    }
  }
  // index_topk 512 of the visible compressed keys.
  for (const auto& [n, k, zeros, released, perf_only] :
       {std::tuple<size_t, size_t, int, bool, bool>{1000, 37, 0, false, false},
        {3000, 512, 90, false, false},
        {16384, 512, 50, true, false},
        {65536, 512, 50, true, true}}) {
    add_case<TopK>(
        cases,
        {.name = "topk n=" + std::to_string(n) + " k=" + std::to_string(k) + " zeros=" + std::to_string(zeros) + "%",
         .op = "topk",
         .numerics = {Numerics::kExact},  // one kernel
         .released = released,
         .perf_only = perf_only,
         .bound = "bitwise = stable sort (lower index wins ties), first k ascending",
         .bytes = 4.0 * n + 4.0 * k,
         .flops = static_cast<double>(n)},  // one comparison per score, nominally
        n, k, zeros);
  }
}

}  // namespace cedar::ops::testing
