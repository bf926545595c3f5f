// cedar against the independent golden implementation (tools/golden/, docs/GOLDEN.md): greedy
// token ids, last-position logits and per-layer stream summaries on tiny checkpoints written by
// make-tiny, for both index-key behaviours, and on the trained cedar-mini (models/cedar-mini) with
// held-out prompts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "ops/sample/sample.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

using nlohmann::json;

std::string golden_dir() { return std::string(CEDAR_SOURCE_DIR) + "/tests/model/data/golden"; }
std::string mini_golden_dir() { return std::string(CEDAR_SOURCE_DIR) + "/tests/model/data/golden-mini"; }

std::vector<std::string> manifest_files(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream in(dir + "/manifest.json");
  if (!in) return out;
  json m = json::parse(in);
  for (const auto& r : m["runs"]) out.push_back(r["file"].get<std::string>());
  return out;
}

struct StepTrace {
  std::vector<float> logits;
  std::vector<std::vector<float>> layer_last;  // [layer][hc*dim] of the chunk's last token
};

json read_golden(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return json::parse(in);
}

IndexKeyMode golden_index_keys(const json& g) {
  return g["index_keys"] == "owner" ? IndexKeyMode::kOwner : IndexKeyMode::kReference;
}

// Replays the golden's calls (one prefill, then one token per call) and compares, bit for bit,
// the per-layer summaries, the top-32 logits and every greedy id.
void expect_matches_golden(Model* m, const json& g, const std::string& name) {
  ThreadPool pool(2);
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto want_ids = g["greedy_ids"].get<std::vector<int32_t>>();
  const size_t V = m->config().vocab_size, hc_dim = static_cast<size_t>(m->config().hc_mult) * m->config().dim;

  SequenceState seq = m->new_sequence(static_cast<int64_t>(prompt.size() + want_ids.size() + 1));
  std::vector<int32_t> got_ids;
  std::vector<int32_t> feed = prompt;
  for (size_t step = 0; step < g["steps"].size(); ++step) {
    const json& gs = g["steps"][step];
    StepTrace tr;
    tr.logits.resize(V);
    tr.layer_last.resize(m->config().n_layers);
    m->set_layer_observer([&](int l, const float* x, size_t) { tr.layer_last[l].assign(x, x + hc_dim); });
    SeqChunk c{&seq, feed};
    ASSERT_EQ(seq.n_tokens, gs["start_pos"].get<int64_t>());
    ASSERT_TRUE(m->forward({&c, 1}, tr.logits.data(), &pool).ok());
    // Per-layer summaries (step 0 and the last step): report the first layer that departs.
    if (gs.contains("layers")) {
      for (size_t l = 0; l < gs["layers"].size(); ++l) {
        const auto& gl = gs["layers"][l];
        const size_t dim = m->config().dim;
        for (int j = 0; j < m->config().hc_mult; ++j) {
          const auto first8 = gl["first8"][j].get<std::vector<float>>();
          for (size_t k = 0; k < first8.size(); ++k)
            ASSERT_EQ(tr.layer_last[l][j * dim + k], first8[k])
                << name << " step " << step << " layer " << l << " stream " << j << " element " << k;
        }
      }
    }
    // Logits: the golden's top-32 (id, value) pairs. The file holds the shortest decimal that reads
    // back to the fp32 value, so compare as fp32 (as a double that decimal is up to half an fp32 ulp
    // away from the value it stands for).
    double worst = 0;
    for (const auto& pair : gs["logits"]["top"]) {
      const int id = pair[0].get<int>();
      worst = std::max(worst, std::fabs(double(tr.logits[id]) - double(pair[1].get<float>())));
    }
    EXPECT_EQ(worst, 0.0) << name << " step " << step << ": max |logit diff| over the golden's top-32";
    const int32_t next = ops::argmax(tr.logits.data(), V);
    got_ids.push_back(next);
    ASSERT_EQ(next, gs["next_id"].get<int32_t>()) << name << " step " << step;
    feed.assign(1, next);
  }
  m->set_layer_observer(nullptr);
  EXPECT_EQ(got_ids, want_ids);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesReferenceImplementation) {
  const json g = read_golden(golden_dir() + "/" + GetParam());
  const uint64_t seed = std::stoull(g["checkpoint"]["name"].get<std::string>().substr(std::string("tiny-cedar-s").size()));
  auto m = testing::load_tiny(seed, golden_index_keys(g));
  expect_matches_golden(m.get(), g, GetParam());
}

// cedar-mini is committed with the repository, so its goldens always run (docs/CEDAR_MINI.md).
class MiniGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MiniGolden, MatchesReferenceImplementation) {
  const json g = read_golden(mini_golden_dir() + "/" + GetParam());
  ModelOptions o;
  o.index_keys = golden_index_keys(g);
  auto m = Model::load(std::string(CEDAR_SOURCE_DIR) + "/models/cedar-mini", o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_matches_golden(m->get(), g, GetParam());
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.size() - 5);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Tiny, Golden, ::testing::ValuesIn(manifest_files(golden_dir())), param_name);
INSTANTIATE_TEST_SUITE_P(CedarMini, MiniGolden, ::testing::ValuesIn(manifest_files(mini_golden_dir())), param_name);

}  // namespace
}  // namespace cedar::model
