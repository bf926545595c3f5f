// Streaming adds no allocation to a decode step once warm: the forward pass's own allocations
// (per-call bookkeeping in Model::forward) are the same with a mapped model and with a streamed one
// whose caches are far too small (so every step still misses, evicts, reads and prefetches).
// Counted on the calling thread through a replaced global operator new.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "tiny_model_util.h"

namespace {
thread_local bool g_counting = false;
thread_local size_t g_allocations = 0;
}  // namespace

void* operator new(size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace cedar::model {
namespace {

size_t decode_allocations(Model& m) {
  ThreadPool pool(2);
  const auto prompt = testing::test_prompt(24, 21);
  SequenceState seq = m.new_sequence(64);
  std::vector<float> logits(m.config().vocab_size);
  SeqChunk ch{&seq, prompt};
  EXPECT_TRUE(m.forward({&ch, 1}, logits.data(), &pool).ok());
  int32_t next = 17;
  auto step = [&] {
    SeqChunk d{&seq, {&next, 1}};
    EXPECT_TRUE(m.forward({&d, 1}, logits.data(), &pool).ok());
    next = static_cast<int32_t>((next * 7919 + 13) % 1000);
  };
  for (int i = 0; i < 4; ++i) step();  // warm-up: scratch and queues reach their high-water marks
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 6; ++i) step();
  g_counting = false;
  return g_allocations;
}

TEST(StreamingAlloc, DecodeStepsAllocateNoMoreThanResident) {
  auto resident = testing::load_tiny(0);
  ModelOptions o;
  o.residency.expert_slots = 8;
  o.residency.engram_slots = 32;
  auto streamed = Model::load(testing::tiny_checkpoint(0), o);
  ASSERT_TRUE(streamed.ok());
  const size_t a = decode_allocations(*resident);
  const size_t b = decode_allocations(**streamed);
  EXPECT_GT((*streamed)->residency_stats().expert_misses, 0u);
  EXPECT_EQ(b, a) << "resident " << a << ", streamed " << b << " allocations over 6 decode steps";
}

}  // namespace
}  // namespace cedar::model
