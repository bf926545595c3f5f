// Model::load: from a checkpoint folder to a model ready to run. The config and layer plan, the
// residency plan (what is mapped and what is streamed under --memory-budget), the weight binding,
// the numerics mode's kernel set and re-coded head, the RoPE tables and the Engram hash. The forward
// pass itself is transformer.cc and the layer types it runs.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "model/kv_layout.h"
#include "model/transformer.h"
#include "weights/streaming_source.h"
#include "model/vision_aligner.h"
#include "model/vision_tower.h"
#include "spec/weight_inventory.h"
#include "ops/formats/formats.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace cedar::model {

Model::~Model() = default;

bool parse_routed_expert_name(std::string_view name, int* layer, int* expert) {
  // layers.L.ffn.experts.X.<w1|w2|w3>.<weight|scale>
  constexpr std::string_view kLayers = "layers.", kExperts = ".ffn.experts.";
  if (!name.starts_with(kLayers)) return false;
  const size_t at = name.find(kExperts);
  if (at == std::string_view::npos) return false;
  auto number = [](std::string_view s, int* out) {
    if (s.empty() || s.size() > 9) return false;
    int v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      v = v * 10 + (ch - '0');
    }
    *out = v;
    return true;
  };
  const std::string_view rest = name.substr(at + kExperts.size());
  return number(name.substr(kLayers.size(), at - kLayers.size()), layer) &&
         number(rest.substr(0, rest.find('.')), expert);
}

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->options_ = options;
  m->dir_ = dir;
  CEDAR_ASSIGN_OR_RETURN(m->config_, load_config(dir + "/config.json"));
  const ModelConfig& c = m->config_;
  if (c.family != ModelFamily::kV41)
    return unimplemented(dir + ": cedar runs DeepSeek-V4.1 checkpoints; this config is DeepSeek-V4 (use it "
                         "with `cedar inspect` / `cedar kv-report` only)");
  m->plan_ = make_layer_plan(c);
  // The residency plan comes first: a streaming run maps only the dense weights.
  CEDAR_RETURN_IF_ERROR(m->plan_residency_for_load());
  io::CheckpointOptions copts;
  copts.progress = options.progress;
  copts.read_all_data = options.verify_data;
  if (m->stream_) copts.map_filter = [](std::string_view name) { return !is_streamed_tensor(name); };
  if (options.expert_filter || options.experts_only) {
    if (m->stream_)
      return unimplemented("expert parallelism with a streaming residency plan is not implemented: every rank "
                           "maps its share of the routed experts (run without --memory-budget, or add hosts)");
    copts.map_filter = [filter = options.expert_filter, only = options.experts_only](std::string_view name) {
      int layer = -1, expert = -1;
      if (parse_routed_expert_name(name, &layer, &expert)) return !filter || filter(layer, expert);
      return !only;
    };
  }
  CEDAR_ASSIGN_OR_RETURN(m->checkpoint_, io::Checkpoint::open(dir, copts));
  {
    std::ifstream in(dir + "/config.json", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    m->fingerprint_ = model_fingerprint(text.str(), m->checkpoint_);
  }
  CEDAR_ASSIGN_OR_RETURN(m->own_geometry_, m->kv_geometry());
  // DSpark stages are optional: a checkpoint stripped of every mtp.* tensor loads without its draft;
  // one that has some must have them all, in the released shapes (WeightMap::bind says which not).
  std::vector<WeightSpec> inventory = weight_inventory(c);
  bool has_dspark = c.n_mtp_layers > 0;
  if (has_dspark && std::none_of(m->checkpoint_.tensors().begin(), m->checkpoint_.tensors().end(),
                                 [](const io::TensorView* t) { return t->name.starts_with("mtp."); })) {
    CEDAR_LOG_INFO("%s: config.json declares %d DSpark stages but the checkpoint has no mtp.* tensors; "
                   "loading without the draft head", dir.c_str(), c.n_mtp_layers);
    std::erase_if(inventory, [](const WeightSpec& w) { return w.group == WeightGroup::kDspark; });
    has_dspark = false;
  }
  CEDAR_ASSIGN_OR_RETURN(WeightMap map, WeightMap::bind(m->checkpoint_, inventory));
  m->weight_map_ = std::make_unique<WeightMap>(std::move(map));
  const bool run_dspark = has_dspark && options.dspark && !options.experts_only && c.dspark_block_size > 0;
  CEDAR_ASSIGN_OR_RETURN(m->weights_, bind_model_weights(c, m->plan_, *m->weight_map_, run_dspark));
  m->set_numerics(options.numerics);
  CEDAR_RETURN_IF_ERROR(m->init_residency());

  // One RoPE table per (theta, YaRN) pair: SWA-only layers use the base theta without YaRN, every
  // compressed layer uses compress_rope_theta with YaRN (spec §2.5).
  const int64_t cached = std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : 65536, 65536);
  m->rope_swa_ = std::make_unique<ops::RopeTable>(c.rope_head_dim, c.rope_theta, std::nullopt, cached);
  std::optional<ops::YarnParams> yarn;
  if (c.original_seq_len > 0) yarn = ops::YarnParams{c.rope_factor, c.beta_fast, c.beta_slow, c.original_seq_len};
  m->rope_compressed_ = std::make_unique<ops::RopeTable>(c.rope_head_dim, c.compress_rope_theta, yarn, cached);

  if (!c.engram_layer_ids.empty() && !options.experts_only) {
    // The Engram hash needs the compressed token map of the tokenizer shipped with the checkpoint.
    CEDAR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::load_dir(dir));
    int n_classes = 0;
    std::vector<int32_t> token_map = tokenizer::build_engram_token_map(*tok, &n_classes);
    if (n_classes != c.engram_compressed_vocab_size)
      return invalid_argument(dir + ": the tokenizer maps to " + std::to_string(n_classes) +
                              " Engram classes but config.json says engram_compressed_vocab_size = " +
                              std::to_string(c.engram_compressed_vocab_size) +
                              " (is tokenizer.json the one released with this checkpoint?)");
    m->engram_layout_ = make_engram_layout(c);
    CEDAR_ASSIGN_OR_RETURN(NgramHasher hasher, NgramHasher::create(c, m->engram_layout_, std::move(token_map)));
    m->engram_hasher_ = std::make_unique<NgramHasher>(std::move(hasher));
  }
  // The forward pass's layer types, with the run modes resolved (look-ahead only when streaming).
  const ModelParts parts{m->config_, m->plan_, *m->weights_, *m->source_, *m->rope_swa_, *m->rope_compressed_};
  m->transformer_ = std::make_unique<Transformer>(parts, options, m->engram_hasher_.get(),
                                                  m->source_->streaming() && options.residency.lookahead);
  if (run_dspark) {
    CEDAR_ASSIGN_OR_RETURN(m->draft_head_, DraftHead::create(*m));
    if (m->draft_head_) m->dspark_hook_.configure(c, m->draft_head_->state_capacity());
  }
  return m;
}

void Model::set_numerics(ops::Numerics n) {
  options_.numerics = n;
  if (n != ops::Numerics::kFast || weights_->head.coded != nullptr) return;
  if (weights_->head.bits == nullptr) return;  // an expert worker maps no head
  // Under a memory budget the copy is only made where the plan holds it (fast numerics at load); a
  // model loaded exact and switched to fast then reads the bf16 head.
  if (options_.residency.memory_budget > 0 && residency_plan_.coded_head_bytes == 0) return;
  // The kernel set readies the head for its GEMV (the fast set: a 12-bit copy behind head.coded).
  weights_->head_coded = ops::kernel_set(n).prepare_gemv_weight(&weights_->head);
  if (weights_->head_coded != nullptr)
    residency_plan_.coded_head_bytes = static_cast<int64_t>(weights_->head_coded->bytes());
}

Status Model::plan_residency_for_load() {
  const ResidencyOptions& r = options_.residency;
  const ParamCounts counts = count_params(weight_inventory(config_));
  ResidencyPlanOptions po;
  po.coded_head = options_.numerics == ops::Numerics::kFast;
  residency_plan_ = resident_plan(config_, plan_, counts, po);
  if (r.memory_budget > 0) {
    po.kv_reserve_bytes = r.kv_reserve;
    CEDAR_ASSIGN_OR_RETURN(residency_plan_, plan_residency(config_, plan_, counts, r.memory_budget, po));
  }
  stream_ = residency_plan_.streaming || r.expert_slots > 0 || r.engram_slots > 0;
  return {};
}

Status Model::init_residency() {
  const ResidencyOptions& r = options_.residency;
  if (!stream_) {
    source_ = make_mapped_source(*weights_, config_.engram_head_dim);
    return {};
  }
  StreamingOptions so;
  so.expert_slots = r.expert_slots ? r.expert_slots : static_cast<size_t>(residency_plan_.expert_slots);
  so.engram_slots = r.engram_slots ? r.engram_slots : static_cast<size_t>(std::max<int64_t>(1, residency_plan_.engram_slots));
  so.stats_file = r.stats_file;
  so.warm_start = r.warm_start;
  so.direct_io = r.direct_io;
  so.io_uring = r.io_uring;
  CEDAR_ASSIGN_OR_RETURN(source_, make_streaming_source(checkpoint_, *weight_map_, config_, plan_, so));
  return {};
}

}  // namespace cedar::model
