// cedar check-shards: opens a checkpoint directory (index + shards, or one model.safetensors),
// validates every header and the index against the shards, and optionally reads every byte.
// Needs no config.json, so it also checks checkpoints cedar cannot run. Exit 0 when sound, 1 with
// one error line naming the shard file and tensor otherwise, 2 for a usage error.
#include <cstdio>
#include <map>

#include "args.h"
#include "command.h"
#include "cedar/checkpoint.h"
#include "progress.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar check-shards DIR [--read-all] [--list]\n"
    "  DIR         a checkpoint directory (model.safetensors.index.json + shards, or model.safetensors)\n"
    "  --read-all  also read every tensor byte once (finds unreadable sectors; slow on big models)\n"
    "  --list      print every tensor: name, dtype, shape, bytes, shard\n";

int cmd_check_shards(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {"--read-all", "--list", "--help"});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar check-shards: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (args->positional().size() != 1) {
    std::fprintf(stderr, "cedar check-shards: give exactly one checkpoint directory\n%s", kUsage);
    return 2;
  }
  const std::string& dir = args->positional()[0];
  ProgressBar headers("checking headers");
  ProgressBar data("reading data");
  io::CheckpointOptions options;
  options.read_all_data = args->has("--read-all");
  options.progress = [&](const io::CheckpointProgress& p) {
    ProgressBar& bar = p.phase == io::CheckpointProgress::Phase::kHeaders ? headers : data;
    if (p.phase == io::CheckpointProgress::Phase::kData) headers.finish();
    bar.update(p.bytes_done, p.bytes_total, p.current_file);
  };
  auto ckpt = io::Checkpoint::open(dir, options);
  headers.finish();
  data.finish();
  if (!ckpt.ok()) {
    std::fprintf(stderr, "cedar check-shards: %s\n", ckpt.status().to_string().c_str());
    return 1;
  }
  if (args->has("--list")) {
    for (const io::TensorView* t : ckpt->tensors()) {
      std::string shape;
      for (size_t i = 0; i < t->shape.size(); ++i) {
        if (i) shape += ',';
        shape += std::to_string(t->shape[i]);
      }
      const size_t slash = t->file.find_last_of('/');
      std::printf("%s %s [%s] %zu %s\n", t->name.c_str(), dtype_name(t->dtype), shape.c_str(), t->nbytes,
                  slash == std::string::npos ? t->file.c_str() : t->file.c_str() + slash + 1);
    }
  }
  std::map<std::string, size_t> by_dtype;
  for (const io::TensorView* t : ckpt->tensors()) by_dtype[dtype_name(t->dtype)] += t->nbytes;
  std::printf("%s: ok: %zu tensors in %zu shard(s), %.3f GiB of tensor data%s\n", dir.c_str(),
              ckpt->tensor_count(), ckpt->shards().size(), ckpt->total_bytes() / 1073741824.0,
              options.read_all_data ? ", every byte read" : "");
  for (const auto& [dtype, bytes] : by_dtype)
    std::printf("  %-8s %.3f GiB\n", dtype.c_str(), bytes / 1073741824.0);
  return 0;
}

}  // namespace

CEDAR_COMMAND("check-shards", "validate a checkpoint's safetensors headers and index (no config needed)",
              cmd_check_shards);

}  // namespace cedar::cli
