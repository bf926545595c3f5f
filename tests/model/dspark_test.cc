// The DSpark draft forward (src/model/dspark.h, docs/DSPARK.md): exact numerics against the
// independent numpy reference's forward_spec (tests/model/data/golden-dspark, made by
// tools/golden/make_goldens.sh), the draft state's chunking and rollback, fast numerics against exact,
// and loading checkpoints with, without and with broken DSpark stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "spec/weight_inventory.h"
#include "ops/sample/sample.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string dspark_golden_dir() { return std::string(CEDAR_SOURCE_DIR) + "/tests/model/data/golden-dspark"; }

std::vector<std::string> dspark_golden_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dspark_golden_dir(), ec))
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs the backbone over `prompt` (one prefill) and then `decode` one token per call, observing the
// hook after every call; after each decode call (and `draft_after_prefill`: after the prefill too)
// calls `on_draft(pos, token)` with the state ready to draft from position pos.
struct Runner {
  Model& m;
  ThreadPool& pool;
  SequenceState seq;
  DraftState state;
  std::vector<float> logits;

  Runner(Model& model, ThreadPool& p, size_t capacity)
      : m(model),
        pool(p),
        seq(model.new_sequence(static_cast<int64_t>(capacity))),
        state(model.draft_head()->new_state()),
        logits(model.config().vocab_size) {}

  // Feeds `ids` (one chunk), observes the hook; returns the backbone's greedy id.
  int32_t step(std::span<const int32_t> ids) {
    SeqChunk c{&seq, ids};
    Status st = m.forward({&c, 1}, logits.data(), &pool);
    EXPECT_TRUE(st.ok()) << st.to_string();
    st = m.draft_head()->observe(state, m.dspark_hidden(0), &pool);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return ops::argmax(logits.data(), logits.size());
  }
};

class DsparkGolden : public ::testing::TestWithParam<std::string> {};

// The golden's flow: prefill (seeds the rings), then per decode call one draft; draft ids,
// confidence and the top-16 logits of every draft position bit for bit.
TEST_P(DsparkGolden, ExactDraftMatchesReferenceForwardSpec) {
  std::ifstream in(dspark_golden_dir() + "/" + GetParam());
  ASSERT_TRUE(in) << GetParam();
  const json g = json::parse(in);
  const uint64_t seed =
      std::stoull(g["checkpoint"]["name"].get<std::string>().substr(std::string("tiny-cedar-s").size()));
  auto m = testing::load_tiny(seed, g["index_keys"] == "owner" ? IndexKeyMode::kOwner : IndexKeyMode::kReference);
  ASSERT_NE(m->draft_head(), nullptr);
  ThreadPool pool(2);
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = g["greedy_ids"].get<std::vector<int32_t>>();
  Runner r(*m, pool, prompt.size() + greedy.size() + 1);
  int32_t next = r.step(prompt);
  ASSERT_EQ(next, greedy[0]);
  const size_t V = m->config().vocab_size, B = m->draft_head()->block_size();
  DraftOutput out;
  for (size_t i = 0; i < g["steps"].size(); ++i) {
    const json& gs = g["steps"][i];
    next = r.step({&next, 1});
    ASSERT_EQ(next, gs["token"].get<int32_t>()) << "step " << i;
    ASSERT_EQ(r.state.n_positions - 1, gs["start_pos"].get<int64_t>());
    {
      Status ds = m->draft_head()->draft(r.state, next, {}, &out, &pool);
      ASSERT_TRUE(ds.ok()) << ds.to_string();
    }
    EXPECT_EQ(out.ids, gs["draft_ids"].get<std::vector<int32_t>>()) << GetParam() << " step " << i;
    const auto conf = gs["confidence"].get<std::vector<float>>();
    for (size_t t = 0; t < B; ++t) {
      EXPECT_EQ(out.confidence[t], conf[t]) << GetParam() << " step " << i << " position " << t;
      const json& gl = gs["logits"][t];
      for (const auto& pair : gl["top"])
        ASSERT_EQ(out.logits[t * V + pair[0].get<size_t>()], pair[1].get<float>())
            << GetParam() << " step " << i << " position " << t << " id " << pair[0];
      double sum = 0;
      for (size_t v = 0; v < V; ++v) sum += out.logits[t * V + v];
      EXPECT_NEAR(sum, gl["sum"].get<double>(), 1e-8 * std::max(1.0, std::fabs(sum)));
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.size() - 5);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Tiny, DsparkGolden, ::testing::ValuesIn(dspark_golden_files()), param_name);

std::vector<float> ring_window(const DraftState& s, int64_t window, size_t head_dim) {
  std::vector<float> out;
  for (const auto& ring : s.rings)
    for (int64_t p = std::max<int64_t>(0, s.n_positions - window); p < s.n_positions; ++p) {
      const float* row = ring.data() + static_cast<size_t>(p % static_cast<int64_t>(s.capacity)) * head_dim;
      out.insert(out.end(), row, row + head_dim);
    }
  return out;
}

// Positions after a prefill fed as one chunk at p > 0 or one token per call (the backbone gives the
// same bits either way) leave the same window rows in the draft state and draft the same bits. The
// chunk of 42 after 5 runs in rounds of 6, 12 and 24 positions (the reference index-key mode splits
// it), the last one longer than the hook keeps (window 16 + 5 + 1).
TEST(Dspark, ChunkedObservationEqualsTokenByToken) {
  auto m = testing::load_tiny(1);
  ThreadPool pool(2);
  const auto prompt = testing::test_prompt(47, 7);
  const int64_t win = m->config().window_size;
  ASSERT_LT(m->draft_head()->state_capacity(), 24u);
  Runner whole(*m, pool, 64), pieces(*m, pool, 64);
  const std::span<const int32_t> p(prompt);
  whole.step(p.first(5));
  whole.step(p.subspan(5));
  pieces.step(p.first(5));
  for (size_t i = 5; i < prompt.size(); ++i) pieces.step(p.subspan(i, 1));
  ASSERT_EQ(whole.state.n_positions, pieces.state.n_positions);
  EXPECT_EQ(ring_window(whole.state, win, m->config().head_dim), ring_window(pieces.state, win, m->config().head_dim));
  DraftOutput a, b;
  ASSERT_TRUE(m->draft_head()->draft(whole.state, 17, {}, &a, &pool).ok());
  ASSERT_TRUE(m->draft_head()->draft(pieces.state, 17, {}, &b, &pool).ok());
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.confidence, b.confidence);
}

// In a batch, each chunk's hook rows are its own: the drafts of three sequences run together (their
// prefills in one forward call, then their continuations in another) equal those run alone.
TEST(Dspark, BatchedHookEqualsSeparate) {
  auto m = testing::load_tiny(2);
  ThreadPool pool(2);
  DraftHead& head = *m->draft_head();
  const std::vector<std::vector<int32_t>> prompts = {testing::test_prompt(40, 1), testing::test_prompt(23, 2),
                                                     testing::test_prompt(61, 3)};
  std::vector<DraftOutput> alone(3), together(3);
  for (size_t i = 0; i < 3; ++i) {
    Runner r(*m, pool, 128);
    const std::span<const int32_t> p(prompts[i]);
    r.step(p.first(p.size() - 3));
    r.step(p.last(3));
    ASSERT_TRUE(head.draft(r.state, 42, {}, &alone[i], &pool).ok());
  }
  std::vector<SequenceState> seqs;
  std::vector<DraftState> states;
  for (size_t i = 0; i < 3; ++i) {
    seqs.push_back(m->new_sequence(128));
    states.push_back(head.new_state());
  }
  std::vector<float> logits(3 * m->config().vocab_size);
  for (bool prefill : {true, false}) {
    std::vector<SeqChunk> chunks;
    for (size_t i = 0; i < 3; ++i) {
      const std::span<const int32_t> p(prompts[i]);
      chunks.push_back({&seqs[i], prefill ? p.first(p.size() - 3) : p.last(3)});
    }
    ASSERT_TRUE(m->forward(chunks, logits.data(), &pool).ok());
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(head.observe(states[i], m->dspark_hidden(i), &pool).ok());
  }
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(head.draft(states[i], 42, {}, &together[i], &pool).ok());
    EXPECT_EQ(alone[i].ids, together[i].ids) << "sequence " << i;
    EXPECT_EQ(alone[i].logits, together[i].logits) << "sequence " << i;
    EXPECT_EQ(alone[i].confidence, together[i].confidence) << "sequence " << i;
  }
}

// Observing the positions of a rejected verification and truncating them away drafts the bits of a
// state that never saw them; rolling back further than the ring holds is refused.
TEST(Dspark, TruncateRollsBackVerifiedPositions) {
  auto m = testing::load_tiny(2);
  ThreadPool pool(2);
  const auto prompt = testing::test_prompt(30, 3);
  Runner r(*m, pool, 64);
  const int32_t next = r.step(prompt);
  DraftOutput before, after;
  ASSERT_TRUE(m->draft_head()->draft(r.state, next, {}, &before, &pool).ok());
  const int64_t n = r.state.n_positions;
  const int B = m->draft_head()->block_size();
  std::vector<int32_t> verify = {next};
  verify.insert(verify.end(), before.ids.begin(), before.ids.end());
  r.step(verify);  // the backbone's verification pass over B + 1 positions
  ASSERT_EQ(r.state.n_positions, n + B + 1);
  ASSERT_TRUE(r.state.truncate(n, m->config().window_size).ok());
  ASSERT_TRUE(m->draft_head()->draft(r.state, next, {}, &after, &pool).ok());
  EXPECT_EQ(before.ids, after.ids);
  EXPECT_EQ(before.logits, after.logits);
  EXPECT_EQ(before.confidence, after.confidence);
  r.step(verify);
  Status too_far = r.state.truncate(n - 1, m->config().window_size);
  EXPECT_FALSE(too_far.ok());
  EXPECT_NE(too_far.message().find("rolled back"), std::string::npos) << too_far.message();
}

TEST(Dspark, RejectsStatesThatCannotDraft) {
  auto m = testing::load_tiny(1);
  ThreadPool pool(2);
  DraftHead& head = *m->draft_head();
  DraftState fresh = head.new_state();
  DraftOutput out;
  EXPECT_FALSE(head.draft(fresh, 5, {}, &out, &pool).ok());  // nothing observed
  Runner r(*m, pool, 64);
  const int32_t next = r.step(testing::test_prompt(20, 1));
  EXPECT_FALSE(head.draft(r.state, -1, {}, &out, &pool).ok());
  EXPECT_FALSE(head.draft(r.state, m->config().vocab_size, {}, &out, &pool).ok());
  DraftOptions sampling;
  sampling.temperature = 1;  // no rng
  EXPECT_FALSE(head.draft(r.state, next, sampling, &out, &pool).ok());
  ops::SampleRng rng(3);
  sampling.rng = &rng;
  sampling.sample_vocab = 1000;
  ASSERT_TRUE(head.draft(r.state, next, sampling, &out, &pool).ok());
  for (int32_t id : out.ids) EXPECT_LT(id, 1000);
}

// Fast numerics run the same draft through the fast kernels. On the same draft state (observed by an
// exact backbone) the tiny checkpoints' draft logits stay within 1e-3 of the exact ones (measured on
// the 2-core VM: 4.8e-7, a few fp32 ulps of the head's sums — the draft is 3 blocks deep, where the
// backbone's 40 layers amplify an ulp into whole logits, docs/GOLDEN.md 2.2) and the first draft agrees.
TEST(Dspark, FastDraftWithinBoundOfExact) {
  for (uint64_t seed : {1, 2, 3}) {
    auto m = testing::load_tiny(seed);
    ThreadPool pool(2);
    Runner r(*m, pool, 128);
    int32_t next = r.step(testing::test_prompt(48, static_cast<uint32_t>(seed)));
    next = r.step({&next, 1});
    DraftOutput exact, fast;
    ASSERT_TRUE(m->draft_head()->draft(r.state, next, {}, &exact, &pool).ok());
    m->set_numerics(ops::Numerics::kFast);
    ASSERT_TRUE(m->draft_head()->draft(r.state, next, {}, &fast, &pool).ok());
    double worst = 0;
    for (size_t i = 0; i < exact.logits.size(); ++i)
      worst = std::max(worst, std::fabs(double(exact.logits[i]) - double(fast.logits[i])));
    EXPECT_LE(worst, 1e-3) << "seed " << seed;
    EXPECT_NE(exact.logits, fast.logits) << "the fast kernels did run";
    EXPECT_EQ(exact.ids[0], fast.ids[0]) << "seed " << seed;
    for (size_t t = 0; t < exact.confidence.size(); ++t) EXPECT_NEAR(exact.confidence[t], fast.confidence[t], 1e-3);
  }
}

// ------------------------------------------------------------------------------------------------
// Loading

std::string write_variant(const std::string& name, const std::function<void(ModelConfig&)>& written,
                          const std::function<void(ModelConfig&)>& declared) {
  const std::string dir =
      std::string(CEDAR_BINARY_DIR) + "/model_test_data/dspark_" + name + "." + std::to_string(::getpid());
  fs::remove_all(dir);
  auto tok = prepare_tiny_tokenizer(testing::repo_tokenizer_dir());
  if (!tok.ok()) throw std::runtime_error(tok.status().to_string());
  ModelConfig c = tiny_config(TinyPreset::kTiny);
  c.engram_compressed_vocab_size = tok->engram_classes;
  written(c);
  TinyOptions opt;
  opt.out_dir = dir;
  opt.seed = 5;
  opt.tokenizer = &*tok;
  Status st = write_tiny_checkpoint(c, opt);
  if (!st.ok()) throw std::runtime_error(st.to_string());
  declared(c);
  std::ofstream(dir + "/config.json") << config_to_hf_json(c);
  return dir;
}

TEST(DsparkLoad, WithoutStagesTheModelLoadsWithoutADraftHead) {
  const auto none = [](ModelConfig&) {};
  // make-tiny --no-dspark: neither tensors nor config.
  const std::string off = write_variant("off", remove_dspark, none);
  auto a = Model::load(off);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ((*a)->draft_head(), nullptr);
  EXPECT_EQ((*a)->dspark_hidden(0).n, 0u);
  // The released config with every mtp.* tensor stripped: loads, without the draft.
  const std::string stripped = write_variant("stripped", remove_dspark, [](ModelConfig& c) {
    ModelConfig full = tiny_config(TinyPreset::kTiny);
    full.engram_compressed_vocab_size = c.engram_compressed_vocab_size;
    c = full;
  });
  auto b = Model::load(stripped);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*b)->draft_head(), nullptr);
  // Stages present but turned off: validated, not run.
  ModelOptions o;
  o.dspark = false;
  auto c = Model::load(testing::tiny_checkpoint(1), o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->draft_head(), nullptr);
  fs::remove_all(off);
  fs::remove_all(stripped);
}

// make-tiny writes the released stage layout for every preset; --no-dspark (remove_dspark) none.
TEST(DsparkLoad, EveryPresetHasStagesUnlessRemoved) {
  for (TinyPreset p : {TinyPreset::kTiny, TinyPreset::kSmall, TinyPreset::kStream, TinyPreset::kAttention}) {
    ModelConfig c = tiny_config(p);
    c.engram_compressed_vocab_size = 99092;  // the repository tokenizer's (make-tiny fills it from the tokenizer)
    ASSERT_TRUE(validate_config(c).ok()) << validate_config(c).to_string();
    EXPECT_EQ(c.n_mtp_layers, 3);
    EXPECT_EQ(c.dspark_block_size, 5);
    const auto inv = weight_inventory(c);
    const auto has = [&](const std::string& name) {
      return std::any_of(inv.begin(), inv.end(), [&](const WeightSpec& w) { return w.name == name; });
    };
    EXPECT_TRUE(has("mtp.0.main_proj.weight") && has("mtp.0.main_proj.scale") && has("mtp.0.main_norm.weight"));
    EXPECT_TRUE(has("mtp.2.markov_head.embed.weight") && has("mtp.2.confidence_head.proj.weight"));
    EXPECT_TRUE(has("mtp.1.ffn.experts." + std::to_string(c.dspark_n_routed_experts - 1) + ".w2.weight"));
    remove_dspark(c);
    ASSERT_TRUE(validate_config(c).ok()) << validate_config(c).to_string();
    for (const WeightSpec& w : weight_inventory(c)) EXPECT_FALSE(w.name.starts_with("mtp.")) << w.name;
  }
}

TEST(DsparkLoad, MisshapenStageTensorsNameTheTensor) {
  // Written with a Markov rank of 16, declared 32: the Markov and confidence tensors mismatch.
  const std::string dir = write_variant(
      "rank", [](ModelConfig&) {}, [](ModelConfig& c) { c.dspark_markov_rank = 32; });
  auto m = Model::load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("mtp.2.markov_head.embed.weight"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("wrong dtype or shape"), std::string::npos) << m.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cedar::model
