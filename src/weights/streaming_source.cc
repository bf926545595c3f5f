#include "weights/streaming_source.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "core/check.h"
#include "core/file.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/block_reader.h"
#include "io/safetensors_writer.h"
#include "io/slot_cache.h"

namespace cedar::model {
namespace {

constexpr uint64_t kAlign = io::kDirectIoAlignment;
constexpr uint64_t kMergeGap = 64 * 1024;  // read across gaps this small: one request beats two
// Reads are cut into pieces of at most 1 MiB: many requests in flight keep an NVMe queue busy where
// one 18 MiB read would be split by the kernel anyway, and fio's comparison uses the same size.
constexpr uint64_t kMaxRead = 1 << 20;
constexpr char kStatsMagic[8] = {'C', 'E', 'D', 'R', 'S', 'T', '0', '1'};

struct Extent {
  uint32_t file = 0;
  uint64_t offset = 0, length = 0, need = 0;  // aligned offset/length; bytes that must arrive
  uint64_t slot_pos = 0;
};

// Where one expert's bytes come from and where its six tensors land in a slot.
struct ExpertLayout {
  uint32_t first_extent = 0, n_extents = 0;
  uint64_t tensor_pos[6] = {};  // w1, w1.scale, w2, w2.scale, w3, w3.scale within the slot
};

class StreamingSource;

class ExpertFiller final : public io::SlotFiller {
 public:
  explicit ExpertFiller(StreamingSource& s) : s_(s) {}
  size_t describe(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) override;

 private:
  StreamingSource& s_;
};

class RowFiller final : public io::SlotFiller {
 public:
  explicit RowFiller(StreamingSource& s) : s_(s) {}
  size_t describe(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) override;

 private:
  StreamingSource& s_;
};

class StreamingSource final : public WeightSource {
 public:
  Status init(const io::Checkpoint& ckpt, const WeightMap& map, const ModelConfig& c, const LayerPlan& plan,
              const StreamingOptions& o);

  bool streaming() const override { return true; }
  size_t max_held() const override { return experts_->n_slots(); }

  void will_need(int layer, std::span<const int32_t> ids) override {
    Timer timer;  // issuing reads can block too (a full device queue): count it as I/O time
    for (int32_t x : ids) {
      const uint64_t key = layer_base_[layer] + static_cast<uint64_t>(x);
      if (routed_[key] < UINT32_MAX) ++routed_[key];
      const bool present = experts_->resident(key);
      if (present) ++expert_hits_;
      else {
        ++expert_misses_;
        ++reads_[key];
      }
      const int slot = experts_->fetch(key, io::SlotCache::Mode::kHold);
      CEDAR_CHECK(slot != io::SlotCache::kNoSlot, "expert cache: more experts announced than max_held()");
      held_.push_back({key, slot});
    }
    io_wait_ += timer.seconds();
  }
  void hint(int layer, std::span<const int32_t> ids) override {
    Timer timer;
    for (int32_t x : ids) {
      const uint64_t key = layer_base_[layer] + static_cast<uint64_t>(x);
      if (experts_->resident(key)) continue;
      // A prefetched expert costs a read even when the guess is wrong; count it.
      if (experts_->fetch(key, io::SlotCache::Mode::kPrefetch) != io::SlotCache::kNoSlot) ++reads_[key];
    }
    io_wait_ += timer.seconds();
  }
  ExpertWeights get(int layer, int expert) override {
    const uint64_t key = layer_base_[layer] + static_cast<uint64_t>(expert);
    int slot = io::SlotCache::kNoSlot;
    for (const auto& h : held_)
      if (h.first == key) slot = h.second;
    CEDAR_CHECK(slot != io::SlotCache::kNoSlot, "expert %d of layer %d was not announced by will_need", expert, layer);
    Timer t;
    const uint8_t* base = experts_->wait(slot);
    io_wait_ += t.seconds();
    const ExpertLayout& L = layouts_[key];
    auto fp4 = [&](int w) {
      return ops::Fp4Weight{base + L.tensor_pos[2 * w], base + L.tensor_pos[2 * w + 1], shape_n_[w], shape_k_[w]};
    };
    return {fp4(0), fp4(1), fp4(2)};
  }
  void release_all() override {
    for (const auto& h : held_) experts_->release(h.second);
    held_.clear();
  }

  void will_need_rows(std::span<const int64_t> rows, size_t per_token, size_t n_columns) override {
    if (!rows_) return;
    Timer timer;
    const size_t n_tokens = rows.size() / per_token;
    // Layer by layer (the first Engram layer's rows are needed first), prefetching at most half the
    // row cache: rows beyond that would evict each other before use; gather_rows reads them then.
    size_t budget = std::max<size_t>(1, rows_->n_slots() / 2);
    for (size_t j0 = 0; j0 < per_token; j0 += n_columns)
      for (size_t t = 0; t < n_tokens; ++t)
        for (size_t j = j0; j < j0 + n_columns; ++j) {
          const int64_t r = rows[t * per_token + j];
          const size_t layer = j / n_columns;
          if (r < 0 || layer >= tables_.size() || r >= tables_[layer].rows) continue;  // reported at gather
          const uint64_t key = (static_cast<uint64_t>(layer) << 48) | static_cast<uint64_t>(r);
          if (rows_->resident(key)) {
            ++engram_hits_;
          } else {
            ++engram_misses_;
            if (budget > 0) {
              --budget;
              (void)rows_->fetch(key, io::SlotCache::Mode::kPrefetch);
            }
          }
        }
    io_wait_ += timer.seconds();
  }
  void gather_rows(int engram_index, std::span<const int64_t> rows, uint8_t* codes, uint8_t* scales) override {
    const Table& tb = tables_[engram_index];
    Timer t;
    // In batches of half the cache: start every missing row of the batch, then copy them out, so
    // rows that were not prefetched (or were evicted since) are read in parallel, not one by one.
    const size_t batch = std::max<size_t>(1, rows_->n_slots() / 2);
    for (size_t b0 = 0; b0 < rows.size(); b0 += batch) {
      const size_t b1 = std::min(rows.size(), b0 + batch);
      for (size_t i = b0; i < b1; ++i) {
        const uint64_t key = (static_cast<uint64_t>(engram_index) << 48) | static_cast<uint64_t>(rows[i]);
        if (!rows_->resident(key)) (void)rows_->fetch(key, io::SlotCache::Mode::kPrefetch);
      }
      for (size_t i = b0; i < b1; ++i) {
        const uint64_t key = (static_cast<uint64_t>(engram_index) << 48) | static_cast<uint64_t>(rows[i]);
        const int s = rows_->fetch(key, io::SlotCache::Mode::kHold);
        CEDAR_CHECK(s != io::SlotCache::kNoSlot, "Engram row cache: no slot");
        const uint8_t* p = rows_->wait(s);
        std::memcpy(codes + i * tb.code_bytes, p, tb.code_bytes);
        std::memcpy(scales + i * tb.scale_bytes, p + tb.code_bytes, tb.scale_bytes);
        rows_->release(s);
      }
    }
    io_wait_ += t.seconds();
  }

  Status error() const override {
    if (!experts_->error().ok()) return experts_->error();
    if (rows_ && !rows_->error().ok()) return rows_->error();
    return {};
  }
  ResidencyStats stats() const override {
    ResidencyStats s;
    s.expert_hits = expert_hits_;
    s.expert_misses = expert_misses_;
    s.expert_prefetches = experts_->stats().prefetches;
    s.expert_prefetch_used = experts_->stats().prefetch_used;
    s.expert_bytes = experts_->stats().bytes_read;
    s.engram_hits = engram_hits_;
    s.engram_misses = engram_misses_;
    if (rows_) s.engram_bytes = rows_->stats().bytes_read;
    s.max_reads_per_expert = reads_.empty() ? 0 : *std::max_element(reads_.begin(), reads_.end());
    s.io_wait_seconds = io_wait_;
    return s;
  }
  void reset_stats() override {
    experts_->wait_all();
    if (rows_) rows_->wait_all();
    experts_->reset_stats();
    if (rows_) rows_->reset_stats();
    expert_hits_ = expert_misses_ = engram_hits_ = engram_misses_ = 0;
    std::fill(reads_.begin(), reads_.end(), 0);
    io_wait_ = 0;
  }
  Status save_stats() override;

  // Filler callbacks.
  size_t describe_expert(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) {
    const ExpertLayout& L = layouts_[key];
    CEDAR_CHECK(L.n_extents <= max, "expert with %u reads", L.n_extents);
    for (uint32_t i = 0; i < L.n_extents; ++i) {
      const Extent& e = extents_[L.first_extent + i];
      out[i] = {e.file, e.offset, e.length, e.need, slot + e.slot_pos, 0};
    }
    return L.n_extents;
  }
  size_t describe_row(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) {
    CEDAR_CHECK(max >= 2, "row reads");
    const Table& tb = tables_[key >> 48];
    const uint64_t r = key & ((uint64_t{1} << 48) - 1);
    out[0] = {tb.code_file, tb.code_offset + r * tb.code_bytes, tb.code_bytes, tb.code_bytes, slot, 0};
    out[1] = {tb.scale_file, tb.scale_offset + r * tb.scale_bytes, tb.scale_bytes, tb.scale_bytes, slot + tb.code_bytes, 0};
    return 2;
  }

 private:
  struct Table {
    uint32_t code_file = 0, scale_file = 0;
    uint64_t code_offset = 0, scale_offset = 0, code_bytes = 0, scale_bytes = 0;
    int64_t rows = 0;
  };
  Status load_stats_and_warm(bool warm);

  ExpertFiller expert_filler_{*this};
  RowFiller row_filler_{*this};
  std::unique_ptr<io::BlockReader> expert_reader_, row_reader_;
  std::unique_ptr<io::SlotCache> experts_, rows_;
  std::vector<uint64_t> layer_base_;
  std::vector<ExpertLayout> layouts_;
  std::vector<Extent> extents_;
  size_t shape_n_[3] = {}, shape_k_[3] = {};
  std::vector<Table> tables_;
  std::vector<std::pair<uint64_t, int>> held_;
  std::vector<uint32_t> routed_;  // routing count per expert (the sidecar)
  std::vector<uint32_t> reads_;   // reads per expert since reset_stats
  uint64_t expert_hits_ = 0, expert_misses_ = 0, engram_hits_ = 0, engram_misses_ = 0;
  double io_wait_ = 0;
  std::string stats_file_;
  int n_layers_ = 0;
};

size_t ExpertFiller::describe(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) {
  return s_.describe_expert(key, slot, out, max);
}
size_t RowFiller::describe(uint64_t key, uint8_t* slot, io::ReadRequest* out, size_t max) {
  return s_.describe_row(key, slot, out, max);
}

Status StreamingSource::init(const io::Checkpoint& ckpt, const WeightMap& map, const ModelConfig& c,
                             const LayerPlan& plan, const StreamingOptions& o) {
  std::vector<std::string> paths;
  std::map<std::string, uint32_t> file_index;
  for (const auto& sh : ckpt.shards()) {
    file_index[sh.path()] = static_cast<uint32_t>(paths.size());
    paths.push_back(sh.path());
  }
  n_layers_ = c.n_layers;
  // Experts: their extents, merged where neighbouring, each rounded out to 4 KiB.
  uint64_t slot_bytes = 0;
  const char* parts[6] = {".w1.weight", ".w1.scale", ".w2.weight", ".w2.scale", ".w3.weight", ".w3.scale"};
  for (int l = 0; l < c.n_layers; ++l) {
    layer_base_.push_back(layouts_.size());
    for (int x = 0; x < plan.layers[l].n_routed_experts; ++x) {
      const std::string p = "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(x);
      const io::TensorView* t[6];
      for (int i = 0; i < 6; ++i) t[i] = &map.at(p + parts[i]);
      if (layouts_.empty())
        for (int w = 0; w < 3; ++w) {
          shape_n_[w] = static_cast<size_t>(t[2 * w]->shape[0]);
          shape_k_[w] = static_cast<size_t>(t[2 * w]->shape[1]) * 2;
        }
      int order[6] = {0, 1, 2, 3, 4, 5};
      std::sort(order, order + 6, [&](int a, int b) {
        return t[a]->file != t[b]->file ? t[a]->file < t[b]->file : t[a]->file_offset < t[b]->file_offset;
      });
      ExpertLayout L;
      L.first_extent = static_cast<uint32_t>(extents_.size());
      uint64_t pos = 0;
      for (int i = 0; i < 6;) {
        const io::TensorView* a = t[order[i]];
        uint64_t end = a->file_offset + a->nbytes;
        int j = i + 1;
        while (j < 6 && t[order[j]]->file == a->file && t[order[j]]->file_offset <= end + kMergeGap) {
          end = std::max<uint64_t>(end, t[order[j]]->file_offset + t[order[j]]->nbytes);
          ++j;
        }
        const uint64_t begin = a->file_offset / kAlign * kAlign;
        const uint64_t length = (end - begin + kAlign - 1) / kAlign * kAlign;
        for (int k = i; k < j; ++k) L.tensor_pos[order[k]] = pos + (t[order[k]]->file_offset - begin);
        for (uint64_t off = 0; off < length; off += kMaxRead) {
          Extent e;
          e.file = file_index.at(a->file);
          e.offset = begin + off;
          e.length = std::min(kMaxRead, length - off);
          e.need = std::min(e.length, end - e.offset);
          e.slot_pos = pos + off;
          extents_.push_back(e);
          ++L.n_extents;
        }
        pos += length;
        i = j;
      }
      slot_bytes = std::max(slot_bytes, pos);
      layouts_.push_back(L);
    }
  }
  routed_.assign(layouts_.size(), 0);
  reads_.assign(layouts_.size(), 0);
  io::BlockReaderOptions ro;
  ro.direct = o.direct_io;
  ro.io_uring = o.io_uring;
  CEDAR_ASSIGN_OR_RETURN(expert_reader_, io::BlockReader::open(paths, ro));
  io::SlotCacheOptions eo;
  eo.slot_bytes = slot_bytes;
  eo.n_slots = std::max<size_t>(1, std::min(o.expert_slots, layouts_.size()));
  eo.label = "expert cache";
  CEDAR_ASSIGN_OR_RETURN(experts_, io::SlotCache::create(expert_reader_.get(), &expert_filler_, eo));
  held_.reserve(experts_->n_slots());
  CEDAR_LOG_INFO("streaming experts: %zu slots of %.1f MiB (%s%s), Engram: %zu row slots", experts_->n_slots(),
                 experts_->slot_bytes() / 1048576.0, expert_reader_->backend(),
                 expert_reader_->file_count() && expert_reader_->direct(0) ? ", O_DIRECT" : ", buffered",
                 o.engram_slots);

  // Engram tables: rows are small (head_dim + head_dim/32 bytes), read buffered into compact slots.
  for (int l = 0; l < c.n_layers; ++l) {
    if (!plan.layers[l].engram) continue;
    const std::string ep = "layers." + std::to_string(l) + ".engram";
    const io::TensorView& codes = map.at(ep + ".embed.weight");
    const io::TensorView& scales = map.at(ep + ".embed.scale");
    Table tb;
    tb.code_file = file_index.at(codes.file);
    tb.scale_file = file_index.at(scales.file);
    tb.code_offset = codes.file_offset;
    tb.scale_offset = scales.file_offset;
    tb.code_bytes = static_cast<uint64_t>(codes.shape[1]);
    tb.scale_bytes = static_cast<uint64_t>(scales.shape[1]);
    tb.rows = codes.shape[0];
    tables_.push_back(tb);
  }
  if (!tables_.empty()) {
    io::BlockReaderOptions rro = ro;
    rro.direct = false;  // a 264-byte row would cost a 4 KiB aligned read and a 4 KiB slot
    CEDAR_ASSIGN_OR_RETURN(row_reader_, io::BlockReader::open(paths, rro));
    io::SlotCacheOptions so;
    so.slot_bytes = tables_[0].code_bytes + tables_[0].scale_bytes;
    so.slot_align = 8;
    so.n_slots = std::max<size_t>(1, o.engram_slots);
    so.huge_pages = true;
    so.label = "Engram row cache";
    CEDAR_ASSIGN_OR_RETURN(rows_, io::SlotCache::create(row_reader_.get(), &row_filler_, so));
  }
  stats_file_ = o.stats_file;
  return load_stats_and_warm(o.warm_start);
}

// The sidecar: magic, layer count, expert count, then one little-endian u32 routing count per
// expert. A file for another model or a damaged one is ignored with a warning (a cold start).
Status StreamingSource::load_stats_and_warm(bool warm) {
  if (stats_file_.empty()) return {};
  auto bytes = read_whole_file(stats_file_);
  if (!bytes.ok()) return {};  // no statistics yet
  const std::string& b = *bytes;
  const size_t n = layouts_.size();
  uint32_t hdr[2] = {};
  if (b.size() != 16 + 4 * n || std::memcmp(b.data(), kStatsMagic, 8) != 0 ||
      (std::memcpy(hdr, b.data() + 8, 8), hdr[0] != static_cast<uint32_t>(n_layers_) || hdr[1] != n)) {
    CEDAR_LOG_WARN("%s: not expert statistics of this model; starting cold (it will be rewritten)", stats_file_.c_str());
    return {};
  }
  std::memcpy(routed_.data(), b.data() + 16, 4 * n);
  if (!warm) return {};
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t c) { return routed_[a] > routed_[c]; });
  size_t loaded = 0;
  for (uint32_t k : order) {
    if (loaded == experts_->n_slots() || routed_[k] == 0) break;
    (void)experts_->fetch(k, io::SlotCache::Mode::kPrefetch);
    ++loaded;
  }
  experts_->wait_all();
  CEDAR_LOG_INFO("warm start: preloaded the %zu most routed experts from %s", loaded, stats_file_.c_str());
  reset_stats();
  return error();
}

Status StreamingSource::save_stats() {
  if (stats_file_.empty()) return {};
  std::vector<uint8_t> out(16 + 4 * routed_.size());
  std::memcpy(out.data(), kStatsMagic, 8);
  const uint32_t hdr[2] = {static_cast<uint32_t>(n_layers_), static_cast<uint32_t>(routed_.size())};
  std::memcpy(out.data() + 8, hdr, 8);
  std::memcpy(out.data() + 16, routed_.data(), 4 * routed_.size());
  std::span<const uint8_t> chunk(out);
  Status st = io::detail::write_file_atomically(stats_file_, std::span<const std::span<const uint8_t>>(&chunk, 1));
  if (!st.ok())
    return Status(st.code(), "cannot save expert statistics: " + st.message() +
                                 "; free space there, or pass --residency-stats PATH (or none) to put them elsewhere");
  return {};
}

}  // namespace

bool is_streamed_tensor(std::string_view name) {
  if (!name.starts_with("layers.")) return false;  // DSpark stages (mtp.*) and vision stay mapped
  return name.find(".ffn.experts.") != std::string_view::npos || name.ends_with(".engram.embed.weight") ||
         name.ends_with(".engram.embed.scale");
}

Result<std::unique_ptr<WeightSource>> make_streaming_source(const io::Checkpoint& ckpt, const WeightMap& map,
                                                            const ModelConfig& c, const LayerPlan& plan,
                                                            const StreamingOptions& options) {
  auto s = std::make_unique<StreamingSource>();
  CEDAR_RETURN_IF_ERROR(s->init(ckpt, map, c, plan, options));
  return std::unique_ptr<WeightSource>(std::move(s));
}

}  // namespace cedar::model
