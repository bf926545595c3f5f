#include "model/decoder_narrowing.h"

#include <algorithm>
#include <cstring>

namespace cedar::model {

size_t narrow_to_tail(std::vector<ChunkSpan>& chunks, size_t tail, size_t hc, size_t dim, float* streams,
                      float* pre_mix, uint8_t* image_rows, Csa2State& s) {
  const size_t hc_dim = hc * dim;
  size_t out = 0;
  for (ChunkSpan& ch : chunks) {
    const size_t keep = ch.prefill ? std::min(ch.n, tail) : ch.n;
    const size_t drop = ch.n - keep;
    for (size_t t = 0; t < keep; ++t) {
      const size_t from = ch.offset + drop + t, to = out + t;
      if (from == to) continue;
      std::memmove(&streams[to * hc_dim], &streams[from * hc_dim], hc_dim * sizeof(float));
      std::memmove(&pre_mix[to * hc], &pre_mix[from * hc], hc * sizeof(float));
      image_rows[to] = image_rows[from];
      s.move_row(from, to);
    }
    if (ch.prefill && drop && s.topk_width) {
      // Compressed indices were offset by the old window operand length (ch.n); now it is `keep`.
      for (size_t t = 0; t < keep; ++t) {
        int32_t* pub = s.topk_row(out + t);
        for (int32_t j = 0; j < pub[0]; ++j)
          if (pub[1 + j] >= 0) pub[1 + j] = pub[1 + j] - static_cast<int32_t>(ch.n) + static_cast<int32_t>(keep);
      }
    }
    ch.p0 += static_cast<int64_t>(drop);
    ch.tokens += drop;
    ch.offset = out;
    ch.n = keep;
    out += keep;
  }
  return out;
}

}  // namespace cedar::model
