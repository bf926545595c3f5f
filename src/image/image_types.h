// The decoded image every decoder produces (8-bit RGB, as Pillow's `convert("RGB")` leaves it) and the
// limits a hostile image is held to before any pixel memory is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cedar::image {

// Row-major, 3 bytes a pixel (R, G, B), no padding between rows.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;

  const uint8_t* pixel(int x, int y) const { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
};

// Bounds on one image. Checked on the encoded bytes and on the dimensions the header declares, before
// the decoder allocates pixels, so a decompression bomb costs a header read. The defaults admit a
// 20 MB photo of up to 50 megapixels (8K is 33 MP), which is far more than the processor keeps (at most
// max_n_token tokens of 42x42 pixels): the limits only bound memory and time.
struct ImageLimits {
  size_t max_bytes = size_t{20} << 20;          // encoded size
  int64_t max_pixels = 50'000'000;              // width x height of the decoded canvas
  int max_side = 65'535;                        // either dimension (PNG/JPEG/WebP/GIF headers allow more or less)
  size_t max_metadata_bytes = size_t{8} << 20;  // one decompressed PNG ancillary chunk (iCCP, zTXt, iTXt)
};

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif };

const char* image_format_name(ImageFormat format);

}  // namespace cedar::image
