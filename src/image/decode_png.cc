// PNG through libpng. libpng reports errors by longjmp, so every libpng call runs inside
// read_png_pixels(), whose frame holds no object with a destructor; the buffers it fills live in the
// caller. The pixels come out as Pillow's PngImagePlugin + convert("RGB") leave them (decode.h).
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "image/decode_internal.h"

namespace cedar::image::internal {
namespace {

struct PngSession {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
  char message[200] = {};
  const ImageLimits* limits = nullptr;
  // Filled by read_png_pixels.
  png_uint_32 width = 0, height = 0;
  int channels = 0, bit_depth = 0;
  bool too_large = false;
  std::vector<png_byte> raw;  // libpng's output rows, after the transforms below
  std::vector<png_bytep> row_pointers;
};

void read_from_memory(png_structp png, png_bytep out, size_t n) {
  auto* session = static_cast<PngSession*>(png_get_io_ptr(png));
  if (n > session->bytes.size() - session->offset) png_error(png, "the file ends early");
  std::memcpy(out, session->bytes.data() + session->offset, n);
  session->offset += n;
}

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* session = static_cast<PngSession*>(png_get_error_ptr(png));
  std::snprintf(session->message, sizeof session->message, "libpng: %s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // benign defects (an ancillary chunk's CRC) are skipped

// All libpng calls. Returns false on a libpng error (message in session) or when the declared size is
// over the limits (session->too_large). No automatic object with a destructor: longjmp lands here.
bool read_png_pixels(png_structp png, png_infop info, PngSession* session) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, session, read_from_memory);
  // Bound libpng's own allocations: the canvas sides and each decompressed ancillary chunk.
  png_set_user_limits(png, static_cast<png_uint_32>(session->limits->max_side),
                      static_cast<png_uint_32>(session->limits->max_side));
  png_set_chunk_malloc_max(png, session->limits->max_metadata_bytes);
  png_set_chunk_cache_max(png, 256);
  png_read_info(png, info);
  int color_type = 0, interlace = 0;
  png_get_IHDR(png, info, &session->width, &session->height, &session->bit_depth, &color_type, &interlace, nullptr,
               nullptr);
  if (static_cast<int64_t>(session->width) * session->height > session->limits->max_pixels) {
    session->too_large = true;
    return false;
  }
  // Pillow opens palette PNGs as P, 1/2/4-bit grey as 1/L;2/L;4 (scaled to 0..255 like libpng's
  // expansion), 16-bit colour by its high byte and 16-bit grey as I;16 (clipped below). tRNS is not
  // turned into alpha (convert("RGB") ignores it).
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && session->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (session->bit_depth == 16 && color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  session->channels = png_get_channels(png, info);
  session->bit_depth = png_get_bit_depth(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  session->raw.resize(row_bytes * session->height);
  session->row_pointers.resize(session->height);
  for (png_uint_32 y = 0; y < session->height; ++y) session->row_pointers[y] = session->raw.data() + y * row_bytes;
  png_read_image(png, session->row_pointers.data());
  png_read_end(png, nullptr);
  return true;
}

}  // namespace

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits) {
  PngSession session;
  session.bytes = bytes;
  session.limits = &limits;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &session, on_error, on_warning);
  if (png == nullptr) return resource_exhausted("image '" + std::string(name) + "': libpng could not start");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return resource_exhausted("image '" + std::string(name) + "': libpng could not start");
  }
  const bool ok = read_png_pixels(png, info, &session);
  png_destroy_read_struct(&png, &info, nullptr);
  if (session.too_large || (!ok && std::strstr(session.message, "exceeds user limit") != nullptr)) {
    // libpng's own side limit and the pixel limit read the same to the user.
    Status status = check_dimensions(session.width, session.height, name, ImageFormat::kPng, limits);
    if (!status.ok()) return status;
  }
  if (!ok) return corrupt_image(name, ImageFormat::kPng, session.message);
  CEDAR_RETURN_IF_ERROR(check_dimensions(session.width, session.height, name, ImageFormat::kPng, limits));

  RgbImage image = make_rgb_image(static_cast<int>(session.width), static_cast<int>(session.height));
  const int channels = session.channels;
  const bool wide = session.bit_depth == 16;  // only 16-bit grey (+ alpha) is left wide
  for (png_uint_32 y = 0; y < session.height; ++y) {
    const png_byte* in = session.row_pointers[y];
    uint8_t* out = image.rgb.data() + static_cast<size_t>(y) * session.width * 3;
    for (png_uint_32 x = 0; x < session.width; ++x, out += 3) {
      if (channels >= 3) {  // RGB or RGBA: alpha dropped
        std::memcpy(out, in + static_cast<size_t>(x) * channels, 3);
        continue;
      }
      uint8_t grey;
      if (wide) {  // Pillow's I;16 -> RGB: values above 255 clip to 255 (big-endian samples)
        const png_byte* sample = in + static_cast<size_t>(x) * channels * 2;
        grey = sample[0] != 0 ? 255 : sample[1];
      } else {
        grey = in[static_cast<size_t>(x) * channels];
      }
      out[0] = out[1] = out[2] = grey;
    }
  }
  return image;
}

}  // namespace cedar::image::internal
