// `cedar eval` and `cedar generate --top-logprobs` through the binary: the JSON's invariants, the
// KV-economy table, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "e2e_util.h"

namespace cedar::e2e {
namespace {

using nlohmann::json;

std::string text_file(const std::string& name, const std::string& text) {
  const std::string path = test_dir("eval") + "/" + name;
  write_file(path, text);
  return path;
}

const char* kHeldOut =
    "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n\n\n"
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def step(self):\n        self.n += 1\n"
    "        return self.n\n";
const char* kTrain =
    "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        print(os.path.basename(name))\n"
    "    return 0\n\n\nif __name__ == \"__main__\":\n    sys.exit(main(sys.argv))\n";

json eval_json(const std::string& args) {
  RunResult r = run_cedar_stdout("eval -m " + shared_tiny_checkpoint() + " " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return json::parse(r.output, nullptr, false);
}

TEST(EvalCli, ReportsConsistentScoresAndBaselines) {
  const std::string a = text_file("a.py", kHeldOut), b = text_file("b.py", std::string(kHeldOut).substr(0, 60));
  const std::string t = text_file("train.py", kTrain);
  json j = eval_json("--files " + a + " " + b + " --baseline-files " + t + " --ctx 24 --numerics exact");
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["files"].size(), 2u);
  uint64_t tokens = 0;
  double nll = 0;
  for (const json& f : j["files"]) {
    // Every token after the first is scored: as many as the tokenizer gives, minus one.
    RunResult tk = run_cedar_stdout("tokenize --tokenizer " + shared_tiny_checkpoint() + " --file " +
                                    f["file"].get<std::string>() + " --add-special");
    ASSERT_EQ(tk.exit_code, 0) << tk.output;
    const size_t n_ids = json::parse(tk.output).size();
    EXPECT_EQ(f["tokens"].get<size_t>(), n_ids - 1);
    const uint64_t n = f["tokens"];
    EXPECT_GT(n, 1u);
    EXPECT_NEAR(f["perplexity"].get<double>(), std::exp(f["cross_entropy"].get<double>()), 1e-9 * f["perplexity"].get<double>());
    EXPECT_GE(f["top1"].get<double>(), 0.0);
    EXPECT_LE(f["top1"].get<double>(), 1.0);
    for (const char* base : {"unigram", "bigram"}) {
      EXPECT_EQ(f[base]["tokens"], n) << base;  // the same targets
      EXPECT_GT(f[base]["cross_entropy"].get<double>(), 0.0);
    }
    tokens += n;
    nll += n * f["cross_entropy"].get<double>();
  }
  EXPECT_EQ(j["total"]["tokens"], tokens);
  EXPECT_NEAR(j["total"]["cross_entropy"].get<double>(), nll / static_cast<double>(tokens), 1e-9);
  EXPECT_EQ(j["baselines"]["unigram"]["tokens"], tokens);
  EXPECT_EQ(j["stride"], 23);
  // The same file scored with overlapping windows (stride 4) scores the same tokens.
  json s = eval_json("--files " + a + " --ctx 24 --stride 4 --numerics exact");
  EXPECT_EQ(s["total"]["tokens"], j["files"][0]["tokens"]);
  // One window covering the whole file (ctx >= tokens) needs no windowing: the KV switches at their
  // defaults give identical scores to not naming them.
  json d1 = eval_json("--files " + a + " --ctx 24 --numerics exact --kv-dtype ref");
  EXPECT_EQ(d1["total"]["cross_entropy"], j["files"][0]["cross_entropy"]);
}

// The KV-economy table: narrowing is exact when the prompt fits the window (NUMERICS.md), so its row
// must show no difference; every row scores tokens and reports its cost.
TEST(EvalCli, CompareTable) {
  const std::string a = text_file("c.py", kHeldOut);
  json j = eval_json("--files " + a + " --ctx 16 --resume-at 8 --compare");
  const json& rows = j["compare"]["variants"];
  ASSERT_EQ(rows.size(), 4u) << j.dump();
  for (const json& r : rows) {
    EXPECT_GT(r["tokens"].get<uint64_t>(), 0u) << r.dump();
    EXPECT_GE(r["greedy_agreement"].get<double>(), 0.0);
    EXPECT_LE(r["greedy_agreement"].get<double>(), 1.0);
    EXPECT_NEAR(r["delta_cross_entropy"].get<double>(),
                r["variant_cross_entropy"].get<double>() - r["reference_cross_entropy"].get<double>(), 1e-9);
    EXPECT_FALSE(r["cost"].empty());
  }
  EXPECT_EQ(rows[2]["delta_cross_entropy"].get<double>(), 0.0) << rows[2].dump();
  EXPECT_EQ(rows[2]["greedy_agreement"].get<double>(), 1.0);
  EXPECT_LT(rows[0]["cost"]["global_kv_bytes_per_token_reference"].get<double>(),
            rows[0]["cost"]["global_kv_bytes_per_token_bf16"].get<double>());
  // The markdown form.
  RunResult md = run_cedar_stdout("eval -m " + shared_tiny_checkpoint() + " --files " + a + " --ctx 16 --compare");
  ASSERT_EQ(md.exit_code, 0) << md.output;
  EXPECT_NE(md.output.find("| setting | compared with |"), std::string::npos) << md.output;
  EXPECT_NE(md.output.find("| bounded replay"), std::string::npos);
}

TEST(EvalCli, BadInputNamesTheFix) {
  const std::string& m = shared_tiny_checkpoint();
  const std::string a = text_file("d.py", kHeldOut), empty = text_file("empty.txt", "");
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"--files /no/such/file.txt", 1, "/no/such/file.txt"},
           {"--files " + empty, 1, "is empty"},
           {"--files " + a + " --ctx 1", 2, "--ctx must be at least 2"},
           {"--files " + a + " --ctx 99999999", 2, "lower --ctx"},
           {"--files " + a + " --ctx 8 --stride 8", 2, "--stride must be between"},
           {"--files " + a + " --replay bounded", 2, "--resume-at"},
           {"--files " + a + " --kv-dtype fp16", 2, "--kv-dtype"},
           {"--files", 2, "needs at least one value"},
           {"--files " + a + " --baseline-files /no/train.txt", 1, "/no/train.txt"},
       }) {
    RunResult r = run_cedar("eval -m " + m + " " + c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(GenerateCli, TopLogprobs) {
  const std::string& m = shared_tiny_checkpoint();
  RunResult r = run_cedar_stdout("generate -m " + m + " -p 'def f(x):' -n 5 --ignore-eos --json --top-logprobs 4 --numerics exact");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  ASSERT_EQ(j["logprobs"].size(), j["ids"].size());
  ASSERT_EQ(j["ids"].size(), 5u);
  for (size_t i = 0; i < j["ids"].size(); ++i) {
    const json& t = j["logprobs"][i];
    EXPECT_EQ(t["id"], j["ids"][i]);
    ASSERT_EQ(t["top"].size(), 4u);
    // Greedy: the sampled token is the most probable one.
    EXPECT_EQ(t["top"][0]["id"], t["id"]);
    EXPECT_EQ(t["top"][0]["logprob"], t["logprob"]);
    double mass = 0, prev = 0;
    std::set<int> ids;
    for (size_t k = 0; k < 4; ++k) {
      const double lp = t["top"][k]["logprob"];
      EXPECT_LE(lp, 0.0);
      if (k) {
        EXPECT_LE(lp, prev);
      }
      prev = lp;
      mass += std::exp(lp);
      ids.insert(t["top"][k]["id"].get<int>());
      EXPECT_TRUE(t["top"][k]["token"].is_string());
    }
    EXPECT_EQ(ids.size(), 4u);
    EXPECT_LE(mass, 1.0 + 1e-6);
  }
  // Without the flag the JSON is as before.
  RunResult plain = run_cedar_stdout("generate -m " + m + " -p 'def f(x):' -n 5 --ignore-eos --json --numerics exact");
  json p = json::parse(plain.output);
  EXPECT_FALSE(p.contains("logprobs"));
  EXPECT_EQ(p["ids"], j["ids"]);
  EXPECT_EQ(run_cedar("generate -m " + m + " -p x --top-logprobs 3").exit_code, 2);  // needs --json
  EXPECT_EQ(run_cedar("generate -m " + m + " -p x --json --top-logprobs 0").exit_code, 2);
  EXPECT_EQ(run_cedar("generate -m " + m + " -p x --json --top-logprobs 101").exit_code, 2);
}

}  // namespace
}  // namespace cedar::e2e
