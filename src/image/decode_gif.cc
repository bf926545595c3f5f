// GIF through giflib, record by record up to the first image (DGifSlurp would read every frame of an
// animation into memory). The first frame is placed as Pillow's GifImagePlugin places it: on a canvas
// of the logical screen (grown to the frame if the frame extends past it) filled with the frame's
// transparent index, else index 0; every pixel of the frame is written, the transparent one included;
// indices are looked up in the frame's local palette, else the global one. Pillow's palettes start as
// a grey ramp, so an index past the end of the palette (or a GIF without one) reads as (i, i, i).
#include <gif_lib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image/decode_internal.h"

namespace cedar::image::internal {
namespace {

struct GifReader {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
};

int read_from_memory(GifFileType* gif, GifByteType* out, int n) {
  auto* reader = static_cast<GifReader*>(gif->UserData);
  const size_t take = std::min(static_cast<size_t>(n < 0 ? 0 : n), reader->bytes.size() - reader->offset);
  std::memcpy(out, reader->bytes.data() + reader->offset, take);
  reader->offset += take;
  return static_cast<int>(take);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int error = 0;
    DGifCloseFile(gif, &error);
  }
};

std::string gif_error(int code) {
  const char* text = GifErrorString(code);
  return std::string("giflib: ") + (text != nullptr ? text : "unknown error");
}

}  // namespace

Result<RgbImage> decode_gif(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits) {
  GifReader reader{bytes, 0};
  int error = 0;
  std::unique_ptr<GifFileType, GifCloser> gif(DGifOpen(&reader, read_from_memory, &error));
  if (gif == nullptr) return corrupt_image(name, ImageFormat::kGif, gif_error(error));
  CEDAR_RETURN_IF_ERROR(check_dimensions(gif->SWidth, gif->SHeight, name, ImageFormat::kGif, limits));

  int transparent_index = -1;
  for (;;) {
    GifRecordType record;
    if (DGifGetRecordType(gif.get(), &record) == GIF_ERROR) {
      return corrupt_image(name, ImageFormat::kGif, gif_error(gif->Error));
    }
    if (record == TERMINATE_RECORD_TYPE) return corrupt_image(name, ImageFormat::kGif, "it holds no image");
    if (record == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* block = nullptr;
      if (DGifGetExtension(gif.get(), &code, &block) == GIF_ERROR) {
        return corrupt_image(name, ImageFormat::kGif, gif_error(gif->Error));
      }
      // Graphic control extension: [length, flags, delay lo, delay hi, transparent index].
      if (code == GRAPHICS_EXT_FUNC_CODE && block != nullptr && block[0] >= 4) {
        transparent_index = (block[1] & 1) ? block[4] : -1;
      }
      while (block != nullptr) {
        if (DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR) {
          return corrupt_image(name, ImageFormat::kGif, gif_error(gif->Error));
        }
      }
      continue;
    }
    if (record != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) return corrupt_image(name, ImageFormat::kGif, gif_error(gif->Error));
    const GifImageDesc& frame = gif->Image;
    const int64_t canvas_w = std::max<int64_t>(gif->SWidth, int64_t{frame.Left} + frame.Width);
    const int64_t canvas_h = std::max<int64_t>(gif->SHeight, int64_t{frame.Top} + frame.Height);
    CEDAR_RETURN_IF_ERROR(check_dimensions(canvas_w, canvas_h, name, ImageFormat::kGif, limits));

    // Pillow's palette: a grey ramp overwritten by the file's colours.
    std::array<uint8_t, 256 * 3> palette;
    for (int i = 0; i < 256; ++i) palette[3 * i] = palette[3 * i + 1] = palette[3 * i + 2] = static_cast<uint8_t>(i);
    const ColorMapObject* map = frame.ColorMap != nullptr ? frame.ColorMap : gif->SColorMap;
    if (map != nullptr) {
      for (int i = 0; i < std::min(map->ColorCount, 256); ++i) {
        palette[3 * i] = map->Colors[i].Red;
        palette[3 * i + 1] = map->Colors[i].Green;
        palette[3 * i + 2] = map->Colors[i].Blue;
      }
    }
    const int fill = transparent_index >= 0 ? transparent_index : 0;
    std::vector<uint8_t> indices(static_cast<size_t>(canvas_w) * canvas_h, static_cast<uint8_t>(fill));
    std::vector<GifPixelType> line(std::max(frame.Width, 1));
    // Interlaced rows arrive in four passes: every 8th from 0, every 8th from 4, every 4th from 2, odd.
    static constexpr int kPassStart[4] = {0, 4, 2, 1}, kPassStep[4] = {8, 8, 4, 2};
    const int passes = frame.Interlace ? 4 : 1;
    for (int pass = 0; pass < passes; ++pass) {
      const int start = frame.Interlace ? kPassStart[pass] : 0, step = frame.Interlace ? kPassStep[pass] : 1;
      for (int row = start; row < frame.Height; row += step) {
        if (DGifGetLine(gif.get(), line.data(), frame.Width) == GIF_ERROR) {
          return corrupt_image(name, ImageFormat::kGif, gif_error(gif->Error));
        }
        std::memcpy(indices.data() + static_cast<size_t>(frame.Top + row) * canvas_w + frame.Left, line.data(),
                    static_cast<size_t>(frame.Width));
      }
    }
    RgbImage image = make_rgb_image(static_cast<int>(canvas_w), static_cast<int>(canvas_h));
    for (size_t i = 0; i < indices.size(); ++i) std::memcpy(image.rgb.data() + 3 * i, &palette[3 * indices[i]], 3);
    return image;
  }
}

}  // namespace cedar::image::internal
