// How attention stores and reads the entries of a sequence's KV home, chosen once from the model's
// KvDtype (sequence_state.h) instead of branched on per entry: window entries E4M3 + E8M0 and main
// (compressed) entries E2M1 + E4M3 scales as the reference's caches hold them, or bf16 for both (the
// KvDtype::kBf16 experiment). Support, not a model.py class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/sequence_state.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"

namespace cedar::model {

struct KvEntryCodec {
  void (*store_window)(const float* x, size_t head_dim, uint8_t* slot);
  void (*load_window)(const uint8_t* slot, size_t head_dim, float* x);
  void (*store_main)(const float* x, size_t head_dim, uint8_t* entry);
  void (*load_main)(const uint8_t* entry, size_t head_dim, float* x);
  // The window KV rows [n] rounded in place to the values their entries hold (the prefill operand).
  void (*round_window)(float* x, size_t n);
};

inline KvEntryCodec kv_entry_codec(KvDtype d) {
  if (d == KvDtype::kBf16)
    return {[](const float* x, size_t hd, uint8_t* s) { ops::f32_to_bf16_bytes(x, s, hd); },
            [](const uint8_t* s, size_t hd, float* x) { ops::bf16_bytes_to_f32(s, x, hd); },
            [](const float* x, size_t hd, uint8_t* s) { ops::f32_to_bf16_bytes(x, s, hd); },
            [](const uint8_t* s, size_t hd, float* x) { ops::bf16_bytes_to_f32(s, x, hd); },
            [](float* x, size_t n) { ops::round_bf16_inplace({x, n}); }};
  return {[](const float* x, size_t hd, uint8_t* s) { ops::act_quant_fp8(x, hd, s, s + hd); },
          [](const uint8_t* s, size_t hd, float* x) { ops::fp8_dequant_e8m0(s, s + hd, hd, x); },
          [](const float* x, size_t hd, uint8_t* s) { ops::fp4_quant_e4m3(x, hd, s, s + hd / 2); },
          [](const uint8_t* s, size_t hd, float* x) { ops::fp4_dequant_e4m3(s, s + hd / 2, hd, x); },
          [](float* x, size_t n) { ops::act_qdq_fp8_inplace(x, n); }};
}

}  // namespace cedar::model
