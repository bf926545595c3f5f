// libFuzzer target: cedar's image decoders (libpng, libjpeg-turbo, libwebp, giflib behind
// image/decode.h) and the processor on arbitrary bytes. Besides "no crash, no sanitizer report, no
// allocation past libFuzzer's RSS limit", every refusal must name the image, and every accepted
// image must be within the limits and come out of the processor with a patch grid that fits them.
//
// Built and run by run_fuzz.sh (CTest: image_fuzz_decode); not part of the g++ build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "image/decode.h"
#include "image/processor.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "image fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cedar::image::ImageLimits limits;
  limits.max_pixels = 4'000'000;  // keeps one run fast; the checks are the same at any limit
  const auto image = cedar::image::decode_image(std::span<const uint8_t>(data, size), "fuzz-input", limits);
  if (!image.ok()) {
    if (image.status().message().find("'fuzz-input'") == std::string::npos) violated("refusal does not name the image");
    return 0;
  }
  const cedar::image::RgbImage& rgb = image.value();
  if (rgb.width <= 0 || rgb.height <= 0 || static_cast<int64_t>(rgb.width) * rgb.height > limits.max_pixels)
    violated("accepted an image outside the limits");
  if (rgb.rgb.size() != static_cast<size_t>(rgb.width) * rgb.height * 3) violated("pixel buffer size");
  cedar::image::ProcessorConfig config;
  config.max_n_token = 64;  // a small grid: the processor's arithmetic, not its speed, is under test
  const auto processed = cedar::image::process_image(rgb, config);
  if (!processed.ok()) violated("the processor refused a decoded image");
  const auto& p = processed.value();
  if (cedar::image::num_image_tokens(p.plan.n_llm_h, p.plan.n_llm_w) > config.max_n_token) violated("over max_n_token");
  if (p.patches.size() != static_cast<size_t>(p.n_vit_h) * p.n_vit_w * 3 * 14 * 14) violated("patch count");
  return 0;
}
