// The index keys one indexer scores against, in every form indexer_scores reads, built and owned by
// the ops: the dequantised rows (the float64 contract's operand), each row's exact-sum spread (which
// lets provably exact dots run on fp32 vectors) and the integer key tiles (IndexKeyTiles: exact block
// sums of codes, on AVX512-VNNI where the CPU has it). The model appends the FP4 index entries its KV
// owners hold and asks for scores; how the kernels lay the keys out stays here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cedar {
class ThreadPool;
}

namespace cedar::ops {

class IndexKeyStore {
 public:
  // Keys of head_dim values (a multiple of 32); the store starts empty.
  explicit IndexKeyStore(size_t head_dim = 0) : head_dim_(head_dim) {}

  size_t head_dim() const { return head_dim_; }
  size_t size() const { return n_; }
  // Bytes of one index entry: head_dim / 2 of packed E2M1 codes (even element in the low nibble),
  // then head_dim / 32 E8M0 scales (ops/formats/quant.h's index-key entry).
  size_t entry_bytes() const { return head_dim_ / 2 + head_dim_ / 32; }

  // Keeps keys [0, n) (n <= size()); the storage stays for reuse.
  void truncate(size_t n);
  // Appends `count` keys from as many consecutive index entries. Storage grows to the largest count
  // seen and is then reused.
  void append(const uint8_t* entries, size_t count);

  // indexer_scores (attention.h) of one query against keys [0, n_keys) (n_keys <= size()), with the
  // spreads and the key tiles: bit-identical to ref::indexer_scores on the rows. tile_mask as there.
  void scores(const float* q, const float* w, size_t n_heads, size_t n_keys, float* out, ThreadPool* pool,
              const uint8_t* tile_mask = nullptr) const;

  const float* rows() const { return rows_.data(); }  // [size(), head_dim]

 private:
  size_t head_dim_ = 0;
  size_t n_ = 0;
  std::vector<float> rows_;
  std::vector<uint8_t> spread_;
  std::vector<uint8_t> tile_codes_;
  std::vector<double> tile_scales_;
};

}  // namespace cedar::ops
