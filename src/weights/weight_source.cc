#include "weights/weight_source.h"

#include <cstring>
#include <vector>

namespace cedar::model {
namespace {

// The whole checkpoint is mapped: experts are the bound views, Engram rows are copied out of the
// mapped tables (a few hundred bytes per row; the copy keeps one code path for both sources).
class MappedSource final : public WeightSource {
 public:
  MappedSource(const ModelWeights& w, int head_dim) : w_(w), head_dim_(head_dim) {
    for (const BlockWeights& b : w.blocks)
      if (b.has_engram) engram_.push_back(&b.engram);
  }
  bool streaming() const override { return false; }
  size_t max_held() const override { return SIZE_MAX; }
  void will_need(int, std::span<const int32_t>) override {}
  void hint(int, std::span<const int32_t>) override {}
  ExpertWeights get(int layer, int expert) override { return w_.blocks[layer].experts[expert]; }
  void release_all() override {}
  void will_need_rows(std::span<const int64_t>, size_t, size_t) override {}
  void gather_rows(int engram_index, std::span<const int64_t> rows, uint8_t* codes, uint8_t* scales) override {
    const EngramWeights& e = *engram_[engram_index];
    const size_t hd = static_cast<size_t>(head_dim_), sb = hd / 32;
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t r = static_cast<size_t>(rows[i]);
      std::memcpy(codes + i * hd, e.table + r * hd, hd);
      std::memcpy(scales + i * sb, e.table_scale + r * sb, sb);
    }
  }

 private:
  const ModelWeights& w_;
  int head_dim_;
  std::vector<const EngramWeights*> engram_;  // by engram index (engram_layer_ids are ascending)
};

}  // namespace

std::unique_ptr<WeightSource> make_mapped_source(const ModelWeights& weights, int engram_head_dim) {
  return std::make_unique<MappedSource>(weights, engram_head_dim);
}

}  // namespace cedar::model
