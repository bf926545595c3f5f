// JPEG through libjpeg-turbo's libjpeg API with Pillow's decoder settings (libjpeg's defaults: islow
// IDCT, fancy upsampling). libjpeg reports errors through error_exit, which longjmps back into
// read_jpeg_pixels(); that frame holds no object with a destructor. CMYK/YCCK files come out as CMYK
// and are turned into RGB as Pillow does (it reads them as inverted "CMYK;I", then cmyk2rgb).
// jpeglib.h needs size_t and FILE declared before it.
#include <csetjmp>
#include <cstddef>
#include <cstdio>

#include <jerror.h>
#include <jpeglib.h>

#include <string>
#include <vector>

#include "image/decode_internal.h"

namespace cedar::image::internal {
namespace {

// A progressive JPEG may carry thousands of scans, each a full pass over the coefficients: a CPU bomb
// of a few kilobytes. libjpeg-turbo's own tools stop at 500; so does cedar.
constexpr int kMaxJpegScans = 500;

struct JpegSession {
  jpeg_error_mgr error_manager;  // first member: libjpeg hands back this pointer
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 32] = {};
  const ImageLimits* limits = nullptr;
  JDIMENSION width = 0, height = 0;
  int components = 0;
  bool too_large = false;
  std::vector<JSAMPLE> raw;  // width * height * components
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* session = reinterpret_cast<JpegSession*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(session->message, sizeof session->message, "libjpeg: %s", text);
  std::longjmp(session->jump, 1);
}

// A premature end of the data is only a warning to libjpeg (it fills the rest with grey); Pillow
// refuses such a file, and so does cedar. Other warnings (extraneous bytes) are tolerated like Pillow.
void on_emit_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) on_error_exit(cinfo);
}

void on_progress(j_common_ptr cinfo) {
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number > kMaxJpegScans) {
    auto* session = reinterpret_cast<JpegSession*>(cinfo->err);
    std::snprintf(session->message, sizeof session->message, "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(session->jump, 1);
  }
}

bool read_jpeg_pixels(jpeg_decompress_struct* cinfo, std::span<const uint8_t> bytes, JpegSession* session) {
  if (setjmp(session->jump)) return false;
  jpeg_create_decompress(cinfo);
  cinfo->progress = &session->progress;
  jpeg_mem_src(cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  session->width = cinfo->image_width;
  session->height = cinfo->image_height;
  if (static_cast<int64_t>(session->width) * session->height > session->limits->max_pixels ||
      static_cast<int64_t>(session->width) > session->limits->max_side ||
      static_cast<int64_t>(session->height) > session->limits->max_side || session->width == 0 ||
      session->height == 0) {
    session->too_large = true;
    return false;
  }
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE: cinfo->out_color_space = JCS_GRAYSCALE; break;
    case JCS_CMYK:
    case JCS_YCCK: cinfo->out_color_space = JCS_CMYK; break;
    default: cinfo->out_color_space = JCS_RGB; break;
  }
  jpeg_start_decompress(cinfo);
  session->components = cinfo->output_components;
  const size_t row_bytes = static_cast<size_t>(cinfo->output_width) * cinfo->output_components;
  session->raw.resize(row_bytes * cinfo->output_height);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = session->raw.data() + cinfo->output_scanline * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

// Pillow's Convert.c: MULDIV255 and cmyk2rgb.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}
inline uint8_t clip8(int v) { return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v)); }

}  // namespace

Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, std::string_view name, const ImageLimits& limits) {
  JpegSession session;
  session.limits = &limits;
  jpeg_decompress_struct cinfo{};
  cinfo.err = jpeg_std_error(&session.error_manager);
  session.error_manager.error_exit = on_error_exit;
  session.error_manager.emit_message = on_emit_message;
  session.progress.progress_monitor = on_progress;
  const bool ok = read_jpeg_pixels(&cinfo, bytes, &session);
  jpeg_destroy_decompress(&cinfo);
  if (session.too_large) {
    CEDAR_RETURN_IF_ERROR(check_dimensions(session.width, session.height, name, ImageFormat::kJpeg, limits));
  }
  if (!ok) return corrupt_image(name, ImageFormat::kJpeg, session.message);

  RgbImage image = make_rgb_image(static_cast<int>(session.width), static_cast<int>(session.height));
  const size_t n = static_cast<size_t>(session.width) * session.height;
  const JSAMPLE* in = session.raw.data();
  uint8_t* out = image.rgb.data();
  for (size_t i = 0; i < n; ++i, out += 3) {
    if (session.components == 1) {
      out[0] = out[1] = out[2] = in[i];
    } else if (session.components == 3) {
      out[0] = in[3 * i], out[1] = in[3 * i + 1], out[2] = in[3 * i + 2];
    } else {  // CMYK;I: Pillow inverts the samples, then cmyk2rgb
      const JSAMPLE* p = in + 4 * i;
      const int c = 255 - p[0], m = 255 - p[1], y = 255 - p[2], k = 255 - p[3];
      const int nk = 255 - k;
      out[0] = clip8(nk - muldiv255(c, nk));
      out[1] = clip8(nk - muldiv255(m, nk));
      out[2] = clip8(nk - muldiv255(y, nk));
    }
  }
  return image;
}

}  // namespace cedar::image::internal
