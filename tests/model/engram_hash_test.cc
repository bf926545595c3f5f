// Engram hashing: the numpy.random port against real numpy (tools/oracles/engram_multipliers.py,
// output committed in data/engram_numpy_oracle.json), the multipliers against the released values of
// spec §4.3, and the row ids against hand-derived cases and a plain-integer Python restatement of
// engram.py (tools/oracles/engram_hash_oracle.py -> data/engram_hash_oracle.json).
#include "model/engram_hash.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "model_test_util.h"

namespace cedar::model {
namespace {

using nlohmann::json;
namespace nr = numpy_random;

json load_json(const std::string& name) {
  std::ifstream in(testing::source_path("tests/model/data/" + name));
  if (!in) throw std::runtime_error("missing test data " + name);
  return json::parse(in);
}

uint64_t u64_of(const json& v) { return std::stoull(v.get<std::string>()); }
int64_t i64_of(const json& v) { return std::stoll(v.get<std::string>()); }

// ---- numpy.random port ------------------------------------------------------------------------

TEST(NumpyRandom, SeedSequenceStateMatchesNumpy) {
  const json data = load_json("engram_numpy_oracle.json");
  ASSERT_FALSE(data["seed_sequence"].empty());
  for (const json& c : data["seed_sequence"]) {
    const uint64_t entropy = u64_of(c["entropy"]);
    const std::vector<uint32_t> w = nr::seed_sequence_state_u32(entropy, 8);
    ASSERT_EQ(w.size(), c["u32"].size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], c["u32"][i].get<uint32_t>()) << "entropy " << entropy;
    const std::vector<uint64_t> q = nr::seed_sequence_state_u64(entropy, 4);
    for (size_t i = 0; i < q.size(); ++i) EXPECT_EQ(q[i], u64_of(c["u64"][i])) << "entropy " << entropy;
  }
}

TEST(NumpyRandom, Pcg64SeedingAndRawOutputMatchNumpy) {
  const json data = load_json("engram_numpy_oracle.json");
  ASSERT_FALSE(data["pcg64"].empty());
  for (const json& c : data["pcg64"]) {
    nr::Pcg64 g(u64_of(c["seed"]));
    EXPECT_EQ(g.state_hi(), u64_of(c["state"][0]));
    EXPECT_EQ(g.state_lo(), u64_of(c["state"][1]));
    EXPECT_EQ(g.inc_hi(), u64_of(c["inc"][0]));
    EXPECT_EQ(g.inc_lo(), u64_of(c["inc"][1]));
    for (const json& raw : c["raw"]) EXPECT_EQ(g.next_u64(), u64_of(raw)) << "seed " << c["seed"];
  }
}

TEST(NumpyRandom, IntegersMatchNumpyOnEveryBranch) {
  const json data = load_json("engram_numpy_oracle.json");
  ASSERT_FALSE(data["integers"].empty());
  for (const json& c : data["integers"]) {
    nr::Pcg64 g(u64_of(c["seed"]));
    const int64_t low = i64_of(c["low"]), high = i64_of(c["high"]);
    const std::vector<int64_t> got = nr::integers_int64(g, low, high, c["values"].size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], i64_of(c["values"][i])) << "range [" << low << ", " << high << ") draw " << i;
  }
}

TEST(NumpyRandom, BufferedHalfCarriesAcrossCalls) {
  const json data = load_json("engram_numpy_oracle.json");
  ASSERT_FALSE(data["sequences"].empty());
  for (const json& s : data["sequences"]) {
    nr::Pcg64 g(u64_of(s["seed"]));
    for (const json& call : s["calls"]) {
      const std::vector<int64_t> got =
          nr::integers_int64(g, i64_of(call["low"]), i64_of(call["high"]), call["values"].size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], i64_of(call["values"][i]));
    }
  }
}

TEST(NumpyRandom, Next32SplitsOneDrawLowHalfFirst) {
  // Definition of numpy's pcg64_next32: one 64-bit output serves two calls, low half first.
  nr::Pcg64 a(123), b(123);
  const uint64_t raw = a.next_u64();
  EXPECT_EQ(b.next_u32(), static_cast<uint32_t>(raw));
  EXPECT_EQ(b.next_u32(), static_cast<uint32_t>(raw >> 32));
  EXPECT_EQ(b.next_u32(), static_cast<uint32_t>(a.next_u64()));
}

TEST(NumpyRandom, IntegersStayInRange) {
  nr::Pcg64 g(5);
  const std::pair<int64_t, int64_t> ranges[] = {{0, 3}, {-10, -9}, {-1000, 1000}, {0, int64_t{1} << 33},
                                                {std::numeric_limits<int64_t>::min(), 0}};
  for (auto [lo, hi] : ranges) {
    for (int64_t v : nr::integers_int64(g, lo, hi, 200)) {
      EXPECT_GE(v, lo);
      EXPECT_LT(v, hi);
    }
  }
}

// ---- multipliers ------------------------------------------------------------------------------

TEST(EngramMultipliers, ReleasedValuesFromSpec) {
  const auto m = engram_multipliers({1, 14}, 4, 99092);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(m[1], (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}

TEST(EngramMultipliers, MatchNumpyTable) {
  const json data = load_json("engram_numpy_oracle.json");
  ASSERT_GE(data["multipliers"].size(), 50u);
  for (const json& c : data["multipliers"]) {
    const std::vector<int> layers = c["layer_ids"].get<std::vector<int>>();
    const int n = c["max_ngram_size"].get<int>();
    const int64_t vocab = i64_of(c["vocab"]);
    const auto got = engram_multipliers(layers, n, vocab);
    ASSERT_EQ(got.size(), layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      ASSERT_EQ(got[l].size(), static_cast<size_t>(n));
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(got[l][k], i64_of(c["values"][l][k])) << "layer " << layers[l] << " vocab " << vocab << " k " << k;
    }
  }
}

TEST(EngramMultipliers, OddBoundedAndOverflowFree) {
  for (int64_t vocab : {int64_t{1}, int64_t{99092}, int64_t{1} << 31, int64_t{1} << 50}) {
    const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / vocab) / 2);
    for (const auto& row : engram_multipliers({0, 1, 2, 3, 40}, 5, vocab)) {
      for (int64_t m : row) {
        EXPECT_EQ(m % 2, 1);
        EXPECT_GE(m, 1);
        EXPECT_LT(m, 2 * bound);
        // The point of the bound: (vocab - 1) * m fits in int64.
        EXPECT_LE(static_cast<__int128>(vocab - 1) * m, std::numeric_limits<int64_t>::max());
      }
    }
  }
}

// ---- torch % ----------------------------------------------------------------------------------

TEST(TorchRemainder, SignOfDivisor) {
  // Python: -7 % 3 == 2, 7 % -3 == -2, -7 % -3 == -1, 7 % 3 == 1, 6 % 3 == 0, -6 % 3 == 0.
  EXPECT_EQ(torch_remainder_i64(-7, 3), 2);
  EXPECT_EQ(torch_remainder_i64(7, -3), -2);
  EXPECT_EQ(torch_remainder_i64(-7, -3), -1);
  EXPECT_EQ(torch_remainder_i64(7, 3), 1);
  EXPECT_EQ(torch_remainder_i64(6, 3), 0);
  EXPECT_EQ(torch_remainder_i64(-6, 3), 0);
  EXPECT_EQ(torch_remainder_i64(std::numeric_limits<int64_t>::min(), -1), 0);
  // (-2^63) mod 16000057 (Python): 2^63 = 576458698669 * 16000057 + 4951675, so 16000057 - 4951675.
  EXPECT_EQ(torch_remainder_i64(std::numeric_limits<int64_t>::min(), 16000057), 16000057 - 4951675);
}

// ---- NgramHasher ------------------------------------------------------------------------------

constexpr int kRawVocab = 129280;
constexpr int kCompressed = 99092;

// Synthetic map: token t -> t mod 99092 (dense classes 0..99091, as the real map's count).
std::vector<int32_t> synthetic_map() {
  std::vector<int32_t> m(kRawVocab);
  for (int t = 0; t < kRawVocab; ++t) m[t] = t % kCompressed;
  return m;
}

NgramHasher released_hasher() {
  const ModelConfig c = testing::released_v41();
  auto h = NgramHasher::create(c, make_engram_layout(c), synthetic_map());
  if (!h.ok()) throw std::runtime_error(h.status().to_string());
  return std::move(h).value();
}

// Expected row for layer l, column c from explicit look-back ids u[0..3], written straight from
// spec §4.3 with 128-bit products and Python's floor modulo.
int64_t expected_row(const EngramLayout& L, const std::vector<int64_t>& m, const int64_t (&u)[4], int layer, int c) {
  const int order = c / L.n_heads + 2;  // n-gram size
  __int128 r = static_cast<__int128>(u[0]) * m[0];
  for (int k = 1; k < order; ++k) r ^= static_cast<__int128>(u[k]) * m[k];
  const int64_t p = L.primes[layer][order - 2][c % L.n_heads];
  int64_t mod = static_cast<int64_t>(r % p);
  if (mod < 0) mod += p;
  return L.offsets[layer][c] + mod;
}

TEST(NgramHasher, HandDerivedRowsWithStartPadding) {
  const ModelConfig cfg = testing::released_v41();
  const EngramLayout L = make_engram_layout(cfg);
  const NgramHasher h = released_hasher();
  EXPECT_EQ(h.pad_id(), 2);  // token 2 maps to class 2 in the synthetic map
  ASSERT_EQ(h.n_columns(), 24);
  ASSERT_EQ(h.n_layers(), 2);

  // Tokens 5, 99101 (class 9), 7: positions 0..2.
  EngramHistory hist;
  const std::vector<int32_t> toks = {5, 99101, 7};
  std::vector<int64_t> rows(3 * 2 * 24);
  ASSERT_TRUE(h.hash(hist, 0, toks, {}, rows).ok());
  EXPECT_EQ(hist.compressed, (std::vector<int32_t>{5, 9, 7}));
  const int64_t u_at[3][4] = {{5, 2, 2, 2}, {9, 5, 2, 2}, {7, 9, 5, 2}};
  for (int i = 0; i < 3; ++i)
    for (int l = 0; l < 2; ++l)
      for (int c = 0; c < 24; ++c)
        EXPECT_EQ(rows[(i * 2 + l) * 24 + c], expected_row(L, h.multipliers()[l], u_at[i], l, c))
            << "pos " << i << " layer " << l << " col " << c;

  // One worked value in full: position 0, layer 1 (id 1), 2-gram head 0:
  // 5*76632096046245 XOR 2*4839876093313 = 383160480231225 XOR 9679752186626 = 374616683979835
  // (worked out with Python ints); column 0 of layer 0 sits at offset 0 with prime 16000057.
  EXPECT_EQ(rows[0], 5412672);  // 374616683979835 mod 16000057
}

TEST(NgramHasher, DeadTokenActsLikeSequenceStart) {
  const ModelConfig cfg = testing::released_v41();
  const EngramLayout L = make_engram_layout(cfg);
  const NgramHasher h = released_hasher();
  // Classes 10, 11, [image], 12, 13, 14, 15.
  const std::vector<int32_t> toks = {10, 11, 129264, 12, 13, 14, 15};
  const std::vector<uint8_t> text = {1, 1, 0, 1, 1, 1, 1};
  EngramHistory hist;
  std::vector<int64_t> rows(toks.size() * 48);
  ASSERT_TRUE(h.hash(hist, 0, toks, text, rows).ok());
  EXPECT_EQ(hist.compressed[2], kEngramDead);
  const int64_t u_at[7][4] = {{10, 2, 2, 2},  {11, 10, 2, 2}, {2, 2, 2, 2},  {12, 2, 2, 2},
                              {13, 12, 2, 2}, {14, 13, 12, 2}, {15, 14, 13, 12}};
  for (int i = 0; i < 7; ++i)
    for (int l = 0; l < 2; ++l)
      for (int c = 0; c < 24; ++c)
        EXPECT_EQ(rows[(i * 2 + l) * 24 + c], expected_row(L, h.multipliers()[l], u_at[i], l, c)) << "pos " << i;
}

struct OracleSeq {
  std::string name;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> text;
  std::vector<int64_t> rows;  // [n, 2, 24]
};

std::vector<OracleSeq> oracle_sequences() {
  const json data = load_json("engram_hash_oracle.json");
  std::vector<OracleSeq> out;
  for (const json& s : data["sequences"]) {
    OracleSeq q;
    q.name = s["name"].get<std::string>();
    q.tokens = s["tokens"].get<std::vector<int32_t>>();
    for (int f : s["text"].get<std::vector<int>>()) q.text.push_back(static_cast<uint8_t>(f));
    for (const json& pos : s["rows"])
      for (const json& layer : pos)
        for (const json& v : layer) q.rows.push_back(v.get<int64_t>());
    out.push_back(std::move(q));
  }
  return out;
}

// Hashes `s` in chunks of the given sizes (the last one takes the rest) and returns all rows.
std::vector<int64_t> hash_in_chunks(const NgramHasher& h, const OracleSeq& s, const std::vector<size_t>& chunks) {
  EngramHistory hist;
  std::vector<int64_t> all;
  size_t pos = 0, ci = 0;
  while (pos < s.tokens.size()) {
    size_t n = ci < chunks.size() ? chunks[ci++] : s.tokens.size() - pos;
    n = std::min(n, s.tokens.size() - pos);
    std::vector<int64_t> rows(n * 48);
    const Status st = h.hash(hist, static_cast<int64_t>(pos), std::span(s.tokens).subspan(pos, n),
                             std::span(s.text).subspan(pos, n), rows);
    EXPECT_TRUE(st.ok()) << st.to_string();
    all.insert(all.end(), rows.begin(), rows.end());
    pos += n;
  }
  return all;
}

TEST(NgramHasher, MatchesPythonOracleInAnyChunking) {
  const json data = load_json("engram_hash_oracle.json");
  EXPECT_EQ(data["multipliers"][0][0].get<std::string>(), "76632096046245");
  const NgramHasher h = released_hasher();
  const auto seqs = oracle_sequences();
  ASSERT_EQ(seqs.size(), 3u);
  for (const OracleSeq& s : seqs) {
    ASSERT_EQ(s.rows.size(), s.tokens.size() * 48) << s.name;
    EXPECT_EQ(hash_in_chunks(h, s, {}), s.rows) << s.name << " (one prefill)";
    // Prefill of 5, then one token per decode step.
    std::vector<size_t> decode(s.tokens.size(), 1);
    decode[0] = 5;
    EXPECT_EQ(hash_in_chunks(h, s, decode), s.rows) << s.name << " (prefill + decode)";
    EXPECT_EQ(hash_in_chunks(h, s, {1, 2, 3, 1, 7}), s.rows) << s.name << " (uneven chunks)";
  }
}

TEST(NgramHasher, RewindRehashesFromEarlierPosition) {
  const NgramHasher h = released_hasher();
  const OracleSeq s = oracle_sequences()[2];
  EngramHistory hist;
  std::vector<int64_t> rows(s.tokens.size() * 48);
  ASSERT_TRUE(h.hash(hist, 0, s.tokens, s.text, rows).ok());
  // Replace the tail from position 20 by other (draft) tokens, then go back to 20 again and redo the
  // original tail: the result must be as if the drafts never happened.
  const std::vector<int32_t> drafts = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> draft_rows(drafts.size() * 48);
  ASSERT_TRUE(h.hash(hist, 20, drafts, {}, draft_rows).ok());
  EXPECT_EQ(hist.size(), 26);
  const size_t tail = s.tokens.size() - 20;
  std::vector<int64_t> tail_rows(tail * 48);
  ASSERT_TRUE(h.hash(hist, 20, std::span(s.tokens).subspan(20), std::span(s.text).subspan(20), tail_rows).ok());
  EXPECT_TRUE(std::equal(tail_rows.begin(), tail_rows.end(), s.rows.begin() + 20 * 48));
  EXPECT_EQ(hist.size(), static_cast<int64_t>(s.tokens.size()));
}

TEST(NgramHasher, RowsStayInsideTheirColumnRange) {
  const ModelConfig cfg = testing::released_v41();
  const EngramLayout L = make_engram_layout(cfg);
  const NgramHasher h = released_hasher();
  std::mt19937 rng(7);
  std::vector<int32_t> toks(500);
  std::vector<uint8_t> text(500);
  for (size_t i = 0; i < toks.size(); ++i) {
    toks[i] = static_cast<int32_t>(rng() % kRawVocab);
    text[i] = rng() % 10 != 0;
  }
  EngramHistory hist;
  std::vector<int64_t> rows(toks.size() * 48);
  ASSERT_TRUE(h.hash(hist, 0, toks, text, rows).ok());
  for (size_t i = 0; i < toks.size(); ++i) {
    for (int l = 0; l < 2; ++l) {
      for (int c = 0; c < 24; ++c) {
        const int64_t r = rows[(i * 2 + l) * 24 + c];
        const int64_t p = L.primes[l][c / 8][c % 8];
        ASSERT_GE(r, L.offsets[l][c]);
        ASSERT_LT(r, L.offsets[l][c] + p);
        ASSERT_LT(r, L.rows[l]);
      }
    }
  }
}

TEST(NgramHasher, RejectsBadInputWithoutSideEffects) {
  const NgramHasher h = released_hasher();
  EngramHistory hist;
  std::vector<int64_t> rows(2 * 48);
  ASSERT_TRUE(h.hash(hist, 0, std::vector<int32_t>{3, 4}, {}, rows).ok());
  const std::vector<int32_t> before = hist.compressed;

  Status st = h.hash(hist, 2, std::vector<int32_t>{kRawVocab, 4}, {}, rows);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token id 129280 at position 2"), std::string::npos) << st.message();
  st = h.hash(hist, 2, std::vector<int32_t>{-1, 4}, {}, rows);
  EXPECT_FALSE(st.ok());
  st = h.hash(hist, 3, std::vector<int32_t>{1, 4}, {}, rows);
  EXPECT_NE(st.message().find("start_pos 3"), std::string::npos) << st.message();
  st = h.hash(hist, -1, std::vector<int32_t>{1, 4}, {}, rows);
  EXPECT_FALSE(st.ok());
  std::vector<int64_t> small(10);
  st = h.hash(hist, 2, std::vector<int32_t>{1, 4}, {}, small);
  EXPECT_NE(st.message().find("row_ids"), std::string::npos) << st.message();
  st = h.hash(hist, 2, std::vector<int32_t>{1, 4}, std::vector<uint8_t>{1}, rows);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(hist.compressed, before);
}

TEST(NgramHasher, CreateValidatesTokenMap) {
  const ModelConfig cfg = testing::released_v41();
  const EngramLayout L = make_engram_layout(cfg);
  auto bad_class = synthetic_map();
  bad_class[17] = kCompressed;  // one past the last class
  auto r = NgramHasher::create(cfg, L, bad_class);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 17"), std::string::npos) << r.status().message();

  std::vector<int32_t> too_few(kRawVocab);
  for (int t = 0; t < kRawVocab; ++t) too_few[t] = t % 1000;  // 1000 classes, config says 99092
  r = NgramHasher::create(cfg, L, too_few);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("engram_compressed_vocab_size"), std::string::npos);

  r = NgramHasher::create(cfg, L, std::vector<int32_t>{});
  EXPECT_FALSE(r.ok());
  ModelConfig pad_out = cfg;
  pad_out.engram_pad_id = kRawVocab + 5;
  r = NgramHasher::create(pad_out, make_engram_layout(pad_out), synthetic_map());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("engram_pad_token_id"), std::string::npos);
  ModelConfig other = cfg;
  other.engram_n_heads = 4;
  r = NgramHasher::create(other, L, synthetic_map());
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace cedar::model
