// Whole expert-parallel jobs: `mpirun -np N cedar generate --expert-parallel` on this machine, ranks
// joined by Open MPI's TCP transport on loopback only. Greedy ids and logprobs (log-softmax of the
// fp32 logits, printed round-trip) equal to one process for 1, 2 and 3 ranks; a hung or killed rank
// ends the job non-zero naming it (a hung one bounded by --exchange-timeout); mismatched checkpoints
// and settings are refused at start.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dist/placement.h"
#include "spec/config.h"
#include "spec/layer_plan.h"
#include "model/model.h"

namespace cedar::dist {
namespace {

namespace fs = std::filesystem;

struct JobRun {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string data_dir() {
  const fs::path d = fs::path(CEDAR_BINARY_DIR) / "dist_data";
  fs::create_directories(d);
  return d.string();
}

// Runs `cmd` through the shell with stdout and stderr in files (the ranks' stderr interleaves).
std::string next_run_base() {
  static std::atomic<int> counter{0};
  return data_dir() + "/run." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

JobRun run(const std::string& cmd, const std::string& base = next_run_base()) {
  const int status = std::system((cmd + " >" + base + ".out 2>" + base + ".err").c_str());
  JobRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

// A tiny checkpoint per seed, written once (tests run as parallel processes: private dir, then rename).
std::string tiny_checkpoint(int seed) {
  const std::string dir = data_dir() + "/tiny_seed" + std::to_string(seed);
  if (fs::exists(dir + "/model.safetensors.index.json")) return dir;
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  const JobRun r = run(std::string(CEDAR_BIN) + " make-tiny --out " + tmp + " --seed " + std::to_string(seed));
  if (r.exit_code != 0) return "make-tiny failed: " + r.err;
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp);
  return dir;
}

std::string mpirun(int np) {
  EXPECT_EQ(std::string(CEDAR_MPIRUN).find("NOTFOUND"), std::string::npos)
      << "no mpirun at configure time: install openmpi-bin (scripts/deps.sh) and re-run cmake";
  return std::string(CEDAR_MPIRUN) +
         " --mca btl tcp,self --mca btl_tcp_if_include lo --oversubscribe --allow-run-as-root -np " + std::to_string(np);
}

void expect_identical_over_ranks(const std::string& dir, int n_tokens, std::initializer_list<int> ranks) {
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << dir;
  const std::string single_args = " generate -m " + dir + " --prompt-ids 5,17,42,99,7,300,11 -n " +
                                  std::to_string(n_tokens) +
                                  " --numerics exact --json --top-logprobs 5 --threads 1 --ignore-eos";
  const JobRun single = run(std::string(CEDAR_BIN) + single_args);
  ASSERT_EQ(single.exit_code, 0) << single.err;
  ASSERT_NE(single.out.find("\"ids\":["), std::string::npos) << single.out;
  ASSERT_NE(single.out.find("\"logprobs\""), std::string::npos) << single.out;
  for (int np : ranks) {
    const JobRun job = run(mpirun(np) + " " + CEDAR_BIN + single_args + " --expert-parallel");
    ASSERT_EQ(job.exit_code, 0) << np << " ranks:\n" << job.err;
    EXPECT_EQ(job.out, single.out) << np << " ranks";
    // The experts really were computed elsewhere: requests went out (none with one rank).
    const size_t at = job.err.find("expert exchange: ");
    ASSERT_NE(at, std::string::npos) << job.err;
    const long requests = std::strtol(job.err.c_str() + at + 17, nullptr, 10);
    if (np == 1) EXPECT_EQ(requests, 0);
    else EXPECT_GT(requests, 0) << job.err;
  }
}

TEST(MpiJob, TinyGreedyIdsAndLogprobsIdenticalFor1To3Ranks) {
  expect_identical_over_ranks(tiny_checkpoint(0), 6, {1, 2, 3});
}

TEST(MpiJob, CedarMiniIdenticalFor2And3Ranks) {
  const std::string dir = std::string(CEDAR_SOURCE_DIR) + "/models/cedar-mini";
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "no models/cedar-mini";
  expect_identical_over_ranks(dir, 4, {2, 3});
}

TEST(MpiJob, BenchRunsOnTwoRanks) {
  const std::string dir = tiny_checkpoint(0);
  const JobRun job = run(mpirun(2) + " " + CEDAR_BIN + " bench -m " + dir +
                         " -p 4 -n 4 -t 1 -r 1 --no-warmup --expert-parallel");
  ASSERT_EQ(job.exit_code, 0) << job.err;
  EXPECT_NE(job.out.find("| tg4 |"), std::string::npos) << job.out;
  const size_t at = job.err.find("expert exchange: ");
  ASSERT_NE(at, std::string::npos) << job.err;
  EXPECT_GT(std::strtol(job.err.c_str() + at + 17, nullptr, 10), 0) << job.err;
  // One numerics mode only: every rank loads its kernels once.
  const JobRun two_modes = run(std::string(CEDAR_BIN) + " bench -m " + dir + " --numerics fast,exact --expert-parallel");
  EXPECT_EQ(two_modes.exit_code, 2);
  EXPECT_NE(two_modes.err.find("one --numerics mode"), std::string::npos) << two_modes.err;
}

// `cedar eval` scores the same text to the same cross-entropy with the experts on two ranks (exact
// numerics: every logit is the single-process one). Timings aside, the JSON reports are equal.
TEST(MpiJob, EvalScoresIdenticallyOnTwoRanks) {
  const std::string dir = tiny_checkpoint(0);
  const std::string text = data_dir() + "/eval_text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 12; ++i) f << "def f" << i << "(x):\n    return x * " << i << " + 1\n\n";
  }
  const std::string args = " eval -m " + dir + " --files " + text + " --ctx 24 --max-tokens 80 --numerics exact --json --threads 1";
  const JobRun single = run(std::string(CEDAR_BIN) + args);
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const JobRun job = run(mpirun(2) + " " + CEDAR_BIN + args + " --expert-parallel");
  ASSERT_EQ(job.exit_code, 0) << job.err;
  auto scores = [](const std::string& out) {
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    std::string keep;  // every number but the timings
    std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& v, const std::string& path) {
      if (v.is_object()) {
        for (auto it = v.begin(); it != v.end(); ++it)
          if (it.key().find("seconds") == std::string::npos && it.key().find("per_s") == std::string::npos)
            walk(it.value(), path + "." + it.key());
      } else if (v.is_array()) {
        for (size_t i = 0; i < v.size(); ++i) walk(v[i], path + "[" + std::to_string(i) + "]");
      } else {
        keep += path + "=" + v.dump() + "\n";
      }
    };
    walk(j, "");
    return keep;
  };
  const std::string want = scores(single.out);
  EXPECT_NE(want.find("cross_entropy"), std::string::npos) << want;
  EXPECT_EQ(scores(job.out), want);
  const size_t at = job.err.find("expert exchange: ");
  ASSERT_NE(at, std::string::npos) << job.err;
  EXPECT_GT(std::strtol(job.err.c_str() + at + 17, nullptr, 10), 0) << job.err;
  // --compare switches numerics on the head alone: refused.
  const JobRun compare = run(std::string(CEDAR_BIN) + " eval -m " + dir + " --files " + text + " --compare --expert-parallel");
  EXPECT_EQ(compare.exit_code, 2) << compare.err;
  EXPECT_NE(compare.err.find("--compare cannot run with --expert-parallel"), std::string::npos) << compare.err;
}

TEST(MpiJob, MismatchedCheckpointsAreRefusedAtStart) {
  const std::string a = tiny_checkpoint(0), b = tiny_checkpoint(1);
  const std::string common = " generate --prompt-ids 5,17 -n 2 --numerics exact --json --threads 1 --expert-parallel";
  const JobRun job = run(mpirun(1) + " " + CEDAR_BIN + common + " -m " + a + " : -np 1 " + CEDAR_BIN + common + " -m " + b);
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.err.find("rank 1 (host "), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("has another checkpoint"), std::string::npos) << job.err;
  EXPECT_EQ(job.out.find("\"ids\""), std::string::npos) << job.out;  // nothing was generated
}

TEST(MpiJob, MismatchedNumericsAreRefusedAtStart) {
  const std::string a = tiny_checkpoint(0);
  const std::string common = " generate -m " + a + " --prompt-ids 5,17 -n 2 --json --threads 1 --expert-parallel";
  const JobRun job = run(mpirun(1) + " " + CEDAR_BIN + common + " --numerics exact : -np 1 " + CEDAR_BIN + common +
                      " --numerics fast");
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.err.find("rank 1 (host "), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("other settings"), std::string::npos) << job.err;
}

// The plan inspect prints: every routed expert on exactly one rank, the 2 ranks' counts equal (by id),
// and only rank 0 holds the rest.
TEST(MpiJob, InspectPrintsThePerRankPlan) {
  const std::string dir = tiny_checkpoint(0);
  auto config = model::load_config(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  const long total = static_cast<long>(config->n_layers) * config->n_routed_experts;
  const JobRun r = run(std::string(CEDAR_BIN) + " inspect --config " + dir + "/config.json --expert-parallel 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("expert parallel: 2 ranks");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream lines(r.out.substr(at));
  std::string line;
  std::getline(lines, line);  // title
  std::getline(lines, line);  // column names
  long experts[2] = {};
  double other[2] = {};
  for (int rank = 0; rank < 2; ++rank) {
    std::getline(lines, line);
    std::istringstream row(line);
    int shown_rank = -1;
    double expert_gib = 0;
    row >> shown_rank >> experts[rank] >> expert_gib >> other[rank];
    EXPECT_EQ(shown_rank, rank) << line;
  }
  EXPECT_EQ(experts[0] + experts[1], total);
  EXPECT_EQ(experts[0], experts[1]);
  EXPECT_GT(other[0], 0.0);
  EXPECT_EQ(other[1], 0.0);
}

// The sidecar decides the placement when it is for this model: the heaviest expert of every layer
// and the second heaviest land on different ranks, where by id (0 and 2 of 2 ranks) they would not.
TEST(MpiJob, InspectBalancesByTheExpertStatsSidecar) {
  const std::string dir = tiny_checkpoint(0);
  auto config = model::load_config(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  const std::vector<int> per_layer = routed_experts_per_layer(*config, model::make_layer_plan(*config));
  std::vector<uint32_t> counts;
  for (int E : per_layer)
    for (int e = 0; e < E; ++e) counts.push_back(e == 0 ? 1000u : e == 2 ? 900u : 1u);
  const std::string stats = data_dir() + "/stats." + std::to_string(::getpid());
  {
    std::ofstream out(stats, std::ios::binary | std::ios::trunc);
    const uint32_t hdr[2] = {static_cast<uint32_t>(per_layer.size()), static_cast<uint32_t>(counts.size())};
    out.write("CEDRST01", 8);
    out.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    out.write(reinterpret_cast<const char*>(counts.data()), static_cast<std::streamsize>(4 * counts.size()));
  }
  const std::string inspect = std::string(CEDAR_BIN) + " inspect --config " + dir + "/config.json --expert-parallel 2";
  const JobRun by_id = run(inspect);
  const JobRun by_load = run(inspect + " --residency-stats " + stats);
  fs::remove(stats);
  ASSERT_EQ(by_id.exit_code, 0) << by_id.err;
  ASSERT_EQ(by_load.exit_code, 0) << by_load.err;
  EXPECT_NE(by_id.out.find("placement by id"), std::string::npos) << by_id.out;
  EXPECT_NE(by_load.out.find("balanced by the expert-stats sidecar"), std::string::npos) << by_load.out;
  // The same placement the job would use: experts 0 and 2 apart.
  const ExpertPlacement p = place_experts(per_layer, 2, counts);
  for (size_t l = 0; l < per_layer.size(); ++l) EXPECT_NE(p.owner_of(static_cast<int>(l), 0), p.owner_of(static_cast<int>(l), 2));
}

// A worker's side without MPI: a scripted exchange hands Model::serve_experts requests. One the
// worker can serve gets [rows, dim] finite outputs; one for an expert it does not map is refused
// with an error (never a read of unmapped weights).
class ScriptedExchange final : public model::ExpertExchange {
 public:
  explicit ScriptedExchange(std::vector<model::ExpertBatch> requests) : requests_(std::move(requests)) {}
  int rank() const override { return 1; }
  int n_ranks() const override { return 2; }
  int owner(int, int expert) const override { return expert % 2; }
  Status post(std::span<const model::ExpertBatch>) override { return internal_error("not a head"); }
  Status collect(int, std::span<float>) override { return internal_error("not a head"); }
  Result<bool> next(model::ExpertBatch& b) override {
    if (next_ == requests_.size()) return false;
    b = requests_[next_++];
    return true;
  }
  Status reply(std::span<const float> out) override {
    replies.emplace_back(out.begin(), out.end());
    return {};
  }
  std::vector<std::vector<float>> replies;

 private:
  std::vector<model::ExpertBatch> requests_;
  size_t next_ = 0;
};

TEST(ExpertWorker, ServesItsExpertsAndRefusesOthers) {
  const std::string dir = tiny_checkpoint(0);
  model::ModelOptions o;
  o.numerics = ops::Numerics::kExact;
  o.experts_only = true;
  o.expert_filter = [](int, int expert) { return expert % 2 == 1; };
  auto m = model::Model::load(dir, o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const size_t dim = static_cast<size_t>((*m)->config().dim);
  model::ExpertBatch ok;  // two tokens, experts 1 (both tokens) and 3 (token 1)
  ok.layer = 0;
  ok.n_tokens = 2;
  ok.experts = {1, 3};
  ok.counts = {2, 1};
  ok.row_token = {0, 1, 1};
  ok.row_weight = {0.5f, 0.25f, 1.0f};
  ok.x.resize(2 * dim);
  for (size_t i = 0; i < ok.x.size(); ++i) ok.x[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.125f;
  ScriptedExchange good({ok});
  ASSERT_TRUE((*m)->serve_experts(good, nullptr).ok());
  ASSERT_EQ(good.replies.size(), 1u);
  ASSERT_EQ(good.replies[0].size(), 3 * dim);
  bool nonzero = false;
  for (float v : good.replies[0]) {
    ASSERT_TRUE(std::isfinite(v));
    nonzero = nonzero || v != 0.0f;
  }
  EXPECT_TRUE(nonzero);
  model::ExpertBatch other = ok;  // expert 2 lives on rank 0: not mapped here
  other.experts = {1, 2};
  ScriptedExchange bad({other});
  const Status st = (*m)->serve_experts(bad, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not match this rank's checkpoint or expert placement"), std::string::npos)
      << st.message();
  EXPECT_TRUE(bad.replies.empty());
}

// Rank 1 is started through a shell that records its pid; once the head is decoding (the pid file
// exists and the head has streamed text of its 100000-token generation, then 1 s), `signal` hits it, and the job must end on its own
// with the output naming rank 1. `recovery`: mpirun's orte_enable_recovery, under which mpirun does not
// tear the job down when a rank dies, so that the head's own detection (the exchange's deadline) is
// what ends it.
JobRun fault_job(int signal, bool recovery) {
  const std::string dir = tiny_checkpoint(0);
  const std::string pid_file = data_dir() + "/worker." + std::to_string(::getpid()) + ".pid";
  fs::remove(pid_file);
  const std::string common = " generate -m " + dir +
                             " --prompt-ids 5,17,42 -n 100000 --numerics exact --threads 1 --ignore-eos "
                             "--expert-parallel --exchange-timeout 3";
  const std::string cmd = std::string(CEDAR_MPIRUN) + " --mca btl tcp,self --mca btl_tcp_if_include lo " +
                          (recovery ? "--mca orte_enable_recovery 1 " : "") +
                          "--oversubscribe --allow-run-as-root -np 1 " + CEDAR_BIN + common +
                          " : -np 1 sh -c 'echo $$ > " + pid_file + "; exec " + CEDAR_BIN + common + "'";
  JobRun job;
  std::atomic<bool> done{false};
  std::error_code ec;
  const std::string base = next_run_base();
  std::thread runner([&] {
    job = run(cmd, base);
    done = true;
  });
  // The worker's pid, and the head decoding: its first output text (stdout) has been written.
  pid_t pid = 0;
  auto decoding = [&] {
    const auto size = fs::file_size(base + ".out", ec);
    return !ec && size > 0;
  };
  while ((pid == 0 || !decoding()) && !done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(pid_file);
    if (in) in >> pid;
  }
  bool injected = false;
  if (pid != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    injected = !done && ::kill(pid, signal) == 0;
  }
  runner.join();
  if (injected && signal == SIGSTOP) ::kill(pid, SIGKILL);  // normally gone already (the job was aborted)
  fs::remove(pid_file);
  if (!injected) job.err = "the fault was never injected (the job ended first):\n" + job.err;
  return job;
}

// The head's deadline: a stopped rank is named, the head exits non-zero and aborts the job.
TEST(MpiJob, HungRankFailsTheHeadNamingIt) {
  const JobRun job = fault_job(SIGSTOP, false);
  ASSERT_EQ(job.err.find("never injected"), std::string::npos) << job.err;
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.err.find("rank 1 (host "), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("did not answer within 3.0 s during layer"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("expert exchange"), std::string::npos) << job.err;  // a layer's, not the start-up's
}

// mpirun's default: a rank that dies ends the job at once, non-zero, naming the rank and its node.
TEST(MpiJob, KilledRankEndsTheJobNamingIt) {
  const JobRun job = fault_job(SIGKILL, false);
  ASSERT_EQ(job.err.find("never injected"), std::string::npos) << job.err;
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE(job.err.find("process rank 1"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("signal 9"), std::string::npos) << job.err;
}

// With recovery on, the head's deadline catches the dead rank and names it.
TEST(MpiJob, KilledRankUnderRecoveryIsNamedByTheHead) {
  const JobRun job = fault_job(SIGKILL, true);
  ASSERT_EQ(job.err.find("never injected"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("rank 1 (host "), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("during layer"), std::string::npos) << job.err;
  // The command failed on it (its error line), and the job ended (mpirun returned: no hang). mpirun's
  // own abort banner and exit status are unreliable under recovery (Open MPI 4.1 garbles the first).
  EXPECT_NE(job.err.find("cedar generate: rank 1 (host "), std::string::npos) << job.err;
}

}  // namespace
}  // namespace cedar::dist
