// image_dump: runs cedar's decoder and image processor on files and writes what they produced, for the
// Pillow parity test (py/pillow_parity.py), which compares it with the official processor on Pillow.
//
//   image_dump [--patch N] [--downsample N] [--max-tokens N] [--min-pixels N] [--max-wh-ratio R]
//              OUT_DIR FILE...
//
// For each FILE, OUT_DIR/<basename>.bin holds little-endian int32 fields
//   decoded_w, decoded_h, best_w, best_h, n_llm_h, n_llm_w, n_vit_h, n_vit_w
// then the decoded RGB (decoded_w * decoded_h * 3 bytes), the padded canvas (best_w * best_h * 3)
// and the patches (bf16 bits, n_vit_h * n_vit_w * 3 * patch * patch uint16). A file cedar refuses
// gets OUT_DIR/<basename>.err with the error message instead. Exit 0 unless an output cannot be written.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "image/decode.h"
#include "image/processor.h"

namespace {

bool write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

void put_i32(std::string* out, int32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }

}  // namespace

int main(int argc, char** argv) {
  cedar::image::ProcessorConfig config;
  int arg = 1;
  for (; arg + 1 < argc && std::strncmp(argv[arg], "--", 2) == 0; arg += 2) {
    const std::string flag = argv[arg];
    const char* value = argv[arg + 1];
    if (flag == "--patch")
      config.patch_size = std::atoi(value);
    else if (flag == "--downsample")
      config.downsample = std::atoi(value);
    else if (flag == "--max-tokens")
      config.max_n_token = std::atoi(value);
    else if (flag == "--min-pixels")
      config.min_pixels = std::atoll(value);
    else if (flag == "--max-wh-ratio")
      config.max_wh_ratio = std::atof(value);
    else {
      std::cerr << "image_dump: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (argc - arg < 2) {
    std::cerr << "usage: image_dump [flags] OUT_DIR FILE...\n";
    return 2;
  }
  const std::string out_dir = argv[arg++];
  for (; arg < argc; ++arg) {
    const std::string path = argv[arg];
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string base = path.substr(path.find_last_of('/') + 1);
    const std::string stem = out_dir + "/" + base;
    auto decoded = cedar::image::decode_image(bytes, base);
    if (!decoded.ok()) {
      if (!write_file(stem + ".err", decoded.status().message())) return 1;
      continue;
    }
    auto processed = cedar::image::process_image(*decoded, config);
    if (!processed.ok()) {
      if (!write_file(stem + ".err", processed.status().message())) return 1;
      continue;
    }
    std::string out;
    put_i32(&out, decoded->width);
    put_i32(&out, decoded->height);
    put_i32(&out, processed->plan.best_width);
    put_i32(&out, processed->plan.best_height);
    put_i32(&out, processed->plan.n_llm_h);
    put_i32(&out, processed->plan.n_llm_w);
    put_i32(&out, processed->n_vit_h);
    put_i32(&out, processed->n_vit_w);
    out.append(reinterpret_cast<const char*>(decoded->rgb.data()), decoded->rgb.size());
    out.append(reinterpret_cast<const char*>(processed->canvas.rgb.data()), processed->canvas.rgb.size());
    out.append(reinterpret_cast<const char*>(processed->patches.data()), processed->patches.size() * 2);
    if (!write_file(stem + ".bin", out)) return 1;
  }
  return 0;
}
