// Grammar compilation off the request path (constrain/compile_executor.h): shared compilations,
// the deadline, cancellation, the bounded queue, a stuck compilation that does not hold up the
// others, and exceptions (std::bad_alloc included) that fail one compilation only. The jobs block
// on latches the tests open, so every case is decided by events, not by how fast this machine is.
#include "constrain/compile_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <xgrammar/xgrammar.h>

namespace cedar::constrain {
namespace {

using Grammar = CompileExecutor::Grammar;

// A vocabulary of a few letters: compiling `a+` on it takes microseconds.
const xgrammar::TokenizerInfo& tiny_info() {
  static const xgrammar::TokenizerInfo info(std::vector<std::string>{"a", "b", "ab", "</s>"}, xgrammar::VocabType::RAW,
                                            4, std::vector<int32_t>{3});
  return info;
}

class Latch {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A job that waits for `latch` (when given), counts its runs, then compiles a real grammar.
CompileExecutor::Job job(std::atomic<int>* runs, Latch* latch = nullptr) {
  return [runs, latch](xgrammar::GrammarCompiler& compiler) -> Result<Grammar> {
    if (runs) ++*runs;
    if (latch) latch->wait();
    return std::make_shared<const xgrammar::CompiledGrammar>(compiler.CompileRegex("a+"));
  };
}

// Spins (yielding) until `done` holds; the cases below wait for states another thread reaches.
template <typename F>
void until(F done) {
  while (!done()) std::this_thread::yield();
}

TEST(CompileExecutor, ConcurrentRequestsForOneKeyShareOneCompilation) {
  CompileOptions options;
  options.timeout_seconds = 3600;
  CompileExecutor executor(tiny_info(), options);
  std::atomic<int> runs{0};
  Latch latch;
  std::vector<Result<Grammar>> results(4, internal_error("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = executor.run("same", job(&runs, &latch), {}); });
  until([&] { return executor.stats().waiters == 4; });
  latch.open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(executor.stats().joined, 3u);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->get(), results[0]->get()) << "every requester gets the one compiled grammar";
  }
}

TEST(CompileExecutor, AnOverdueCompilationFailsItsRequestAndDoesNotHoldUpTheOthers) {
  CompileOptions options;
  options.threads = 1;  // the stuck compilation holds the only thread until its replacement comes
  options.timeout_seconds = 0.5;
  CompileExecutor executor(tiny_info(), options);
  Latch stuck;
  std::atomic<int> runs{0};
  Result<Grammar> slow = executor.run("slow", job(&runs, &stuck), {});
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(slow.status().message().find("--grammar-compile-timeout"), std::string::npos) << slow.status().message();
  // The same spec again while it still runs: refused at once, not compiled a second time.
  Result<Grammar> again = executor.run("slow", job(&runs, &stuck), {});
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(runs.load(), 1);
  // Another spec compiles on the replacement thread while the overdue one is still stuck.
  Result<Grammar> other = executor.run("other", job(nullptr), {});
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(executor.stats().overdue, 1);
  stuck.open();
  until([&] { return executor.stats().overdue == 0; });
  EXPECT_EQ(executor.stats().threads, 1) << "the replacement leaves once the stuck thread is back";
}

TEST(CompileExecutor, ACancelledRequestStopsWaitingAndAnUnstartedCompilationIsDropped) {
  CompileOptions options;
  options.threads = 1;
  options.timeout_seconds = 3600;
  CompileExecutor executor(tiny_info(), options);
  Latch busy;
  std::atomic<int> busy_runs{0}, dropped_runs{0};
  std::thread holder([&] { (void)executor.run("busy", job(&busy_runs, &busy), {}); });
  until([&] { return executor.stats().running == 1; });
  std::atomic<bool> gone{false};
  std::thread waiter([&] {
    Result<Grammar> r = executor.run("queued", job(&dropped_runs), [&] { return gone.load(); });
    EXPECT_FALSE(r.ok());
  });
  until([&] { return executor.stats().queued == 1; });
  gone = true;  // the client left
  waiter.join();
  EXPECT_EQ(executor.stats().dropped, 1u);
  busy.open();
  holder.join();
  EXPECT_EQ(dropped_runs.load(), 0) << "a compilation nobody waits for is never started";
}

TEST(CompileExecutor, AFullQueueIsRefusedAtOnce) {
  CompileOptions options;
  options.threads = 1;
  options.max_queued = 1;
  options.timeout_seconds = 3600;
  CompileExecutor executor(tiny_info(), options);
  Latch latch;
  std::thread running([&] { (void)executor.run("running", job(nullptr, &latch), {}); });
  until([&] { return executor.stats().running == 1; });
  std::thread queued([&] { (void)executor.run("queued", job(nullptr), {}); });
  until([&] { return executor.stats().queued == 1; });
  Result<Grammar> refused = executor.run("third", job(nullptr), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  latch.open();
  running.join();
  queued.join();
}

TEST(CompileExecutor, ACompilationThatNeverStartedBeforeItsDeadlineIsBusyNotInvalid) {
  CompileOptions options;
  options.threads = 1;
  options.max_overdue = 0;  // no replacement thread: the queued one cannot start
  options.timeout_seconds = 0.2;
  CompileExecutor executor(tiny_info(), options);
  Latch latch;
  std::thread running([&] { (void)executor.run("running", job(nullptr, &latch), {}); });
  until([&] { return executor.stats().running == 1; });
  std::atomic<int> runs{0};
  Result<Grammar> queued = executor.run("queued", job(&runs), {});
  ASSERT_FALSE(queued.ok());
  EXPECT_EQ(queued.status().code(), StatusCode::kResourceExhausted) << queued.status().message();
  latch.open();
  running.join();
  EXPECT_EQ(runs.load(), 0);
}

TEST(CompileExecutor, AllocationFailuresFailOnlyTheirCompilation) {
  CompileExecutor executor(tiny_info(), CompileOptions{});
  Result<Grammar> oom = executor.run("oom", [](xgrammar::GrammarCompiler&) -> Result<Grammar> { throw std::bad_alloc(); },
                                     {});
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(oom.status().message().find("memory"), std::string::npos) << oom.status().message();
  Result<Grammar> length = executor.run(
      "length", [](xgrammar::GrammarCompiler&) -> Result<Grammar> { throw std::length_error("vector::reserve"); }, {});
  ASSERT_FALSE(length.ok());
  EXPECT_NE(length.status().message().find("memory"), std::string::npos) << length.status().message();
  Result<Grammar> fine = executor.run("fine", job(nullptr), {});
  EXPECT_TRUE(fine.ok()) << fine.status().to_string();
}

}  // namespace
}  // namespace cedar::constrain
