// libFuzzer target: the safetensors header parser on arbitrary bytes. Besides "no crash, no
// sanitizer report", every accepted header must satisfy the reader's promises, checked here
// independently of the parser: tensors inside the data section, byte size == numel * dtype size,
// data order, and no two non-empty tensors sharing a byte.
//
// Built and run by run_fuzz.sh (CTest: io_fuzz_safetensors_header); not part of the g++ build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "io/safetensors.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "safetensors fuzzer: accepted header breaks an invariant: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  const auto header = cedar::io::parse_safetensors_header(bytes, "fuzz-input");
  if (!header.ok()) {
    if (header.status().message().find("fuzz-input") == std::string::npos)
      violated("error message does not name the file");
    return 0;
  }
  const cedar::io::SafetensorsHeader& h = header.value();
  if (h.data_offset != 8 + h.header_bytes || h.data_offset > size) violated("data offset");
  const uint64_t data_size = size - h.data_offset;
  uint64_t prev_end = 0;
  uint64_t prev_begin = 0;
  for (const auto& t : h.tensors) {
    if (t.begin > t.end || t.end > data_size) violated("tensor outside the data section");
    unsigned __int128 numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) violated("negative dimension");
      numel *= static_cast<uint64_t>(d);
      if (numel > (static_cast<unsigned __int128>(1) << 64)) numel = static_cast<unsigned __int128>(1) << 64;
    }
    if (numel * cedar::dtype_size(t.dtype) != t.end - t.begin) violated("byte size != numel * dtype size");
    if (t.begin < prev_begin) violated("tensors not in data order");
    prev_begin = t.begin;
    if (t.begin == t.end) continue;
    if (t.begin < prev_end) violated("overlapping tensors");
    prev_end = t.end;
  }
  return 0;
}
