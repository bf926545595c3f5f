// Subcommand registry for the single `cedar` binary. Each cmd_*.cc file defines one command and
// registers it with a file-scope CEDAR_COMMAND(...); main.cc only dispatches. Commands return the
// process exit code (0 ok, 1 runtime error, 2 usage error).
#pragma once

#include <string>
#include <vector>

namespace cedar::cli {

using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* summary;  // one line for `cedar --help`
  CommandFn fn;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn) {
    command_registry().push_back({name, summary, fn});
  }
};

}  // namespace cedar::cli

#define CEDAR_COMMAND_CONCAT_(a, b) a##b
#define CEDAR_COMMAND_NAME_(line) CEDAR_COMMAND_CONCAT_(cedar_command_registrar_, line)
#define CEDAR_COMMAND(name, summary, fn) \
  static ::cedar::cli::CommandRegistrar CEDAR_COMMAND_NAME_(__COUNTER__)(name, summary, fn)
