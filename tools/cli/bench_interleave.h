// cedar bench --interleave N: what a long prompt costs the sequences already decoding. K sequences
// decode; an N-token prompt arrives; the decoders' inter-token gaps during its prefill (median, p99,
// max) and the prompt's time to first token are reported for each --prefill-chunk value (0 = the
// whole prompt in one engine step, the stall chunked prefill removes).
#pragma once

#include "args.h"

namespace cedar::cli {

int bench_interleave(const Args& args);

}  // namespace cedar::cli
