// Computes the next token masks of constrained requests while the model runs the step.
//
// A grammar's mask for step t+1 depends only on the tokens accepted up to step t, so it can be
// computed during step t+1's forward pass instead of after it (vLLM and SGLang overlap structured
// output with the GPU the same way). On a machine with a core to spare the mask costs no wall time
// at all; where every core runs the model it still overlaps the forward pass's waits. The engine
// calls start() just before the forward pass and wait() just after it; the masks are then read on
// the engine's thread. One persistent thread; no allocation per step once the batch size is seen.
#pragma once

#include <condition_variable>
#include <exception>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace cedar::runtime {

class MaskPrefetcher {
 public:
  MaskPrefetcher();
  ~MaskPrefetcher();
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Starts computing next_token_mask() of each non-null constraint (the engine keeps them alive
  // and does not touch them until wait() returns). Returns at once.
  void start(const std::vector<TokenConstraint*>& constraints);
  // Blocks until the masks are ready; masks()[i] belongs to constraints[i] of start() (nullptr:
  // no constraint, or every token allowed). Returns the seconds spent computing them.
  double wait();
  const std::vector<const uint32_t*>& masks() const { return masks_; }
  // After wait(): the message of the exception next_token_mask() threw for constraints[i], or empty.
  // The engine ends that request with it; the other requests of the batch go on.
  bool failed(size_t i) const { return errors_[i] != nullptr; }
  std::string error(size_t i) const;

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenConstraint*> constraints_;
  std::vector<const uint32_t*> masks_;
  // [i]: null unless constraints_[i] threw. Kept as the exception itself: capturing it cannot throw
  // on the mask thread (formatting a message could), and it is read on the engine's thread.
  std::vector<std::exception_ptr> errors_;
  double seconds_ = 0;
  bool pending_ = false, stop_ = false;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace cedar::runtime
