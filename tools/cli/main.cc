// cedar: the command-line entry point. Dispatches to the subcommands registered in cmd_*.cc.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "command.h"

namespace cedar::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

namespace {

void print_help() {
  auto cmds = command_registry();
  std::sort(cmds.begin(), cmds.end(),
            [](const Command& a, const Command& b) { return std::strcmp(a.name, b.name) < 0; });
  std::printf(
      "cedar: an inference engine for DeepSeek-V4.1-Flash\n\n"
      "usage: cedar <command> [options]   (cedar <command> --help for its options)\n\ncommands:\n");
  for (const auto& c : cmds) std::printf("  %-14s %s\n", c.name, c.summary);
}

}  // namespace
}  // namespace cedar::cli

int main(int argc, char** argv) {
  using namespace cedar::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("cedar 0.1.0\n");
    return 0;
  }
  for (const auto& c : command_registry()) {
    if (!std::strcmp(c.name, argv[1])) {
      std::vector<std::string> args(argv + 2, argv + argc);
      return c.fn(args);
    }
  }
  std::fprintf(stderr, "cedar: unknown command '%s' (see cedar --help)\n", argv[1]);
  return 2;
}
