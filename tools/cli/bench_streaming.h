// cedar bench --memory-budget LIST: prefill and decode speed of a checkpoint under memory budgets,
// with what streaming costs: SSD bytes per token, expert and Engram hit rates, look-ahead precision
// and the read bandwidth achieved (against fio's random-read figure when --fio-bandwidth gives it).
#pragma once

#include "args.h"

namespace cedar::cli {

int bench_streaming(const Args& args);

}  // namespace cedar::cli
