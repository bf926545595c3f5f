// Helpers for tests that drive the built `cedar` binary.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

namespace cedar::e2e {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline RunResult run_cedar(const std::string& args) { return run_command(std::string(CEDAR_BIN) + " " + args + " 2>&1"); }

// Separate stdout (returned) from stderr (discarded) for commands whose stdout is JSON.
inline RunResult run_cedar_stdout(const std::string& args) {
  return run_command(std::string(CEDAR_BIN) + " " + args + " 2>/dev/null");
}

// A command line the binary must refuse as a usage error: exit 2, with `message` in its output.
inline ::testing::AssertionResult refused_with(const std::string& args, const std::string& message) {
  const RunResult r = run_cedar(args);
  if (r.exit_code == 2 && r.output.find(message) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "cedar " << args << ": exit " << r.exit_code << ", wanted 2 and \""
                                       << message << "\"; output:\n" << r.output;
}

inline std::string test_dir(const std::string& name) {
  auto d = std::filesystem::path(CEDAR_BINARY_DIR) / "e2e_data" / name;
  std::filesystem::create_directories(d);
  return d.string();
}

// A tiny checkpoint written once per test binary run (seed 0) and shared by tests that only read it.
inline const std::string& shared_tiny_checkpoint() {
  static std::string dir;
  static std::once_flag once;
  std::call_once(once, [] {
    // Test cases run as separate processes in parallel: build privately, then rename into place.
    dir = std::filesystem::path(CEDAR_BINARY_DIR) / "e2e_data" / "tiny_seed0";
    if (std::filesystem::exists(dir + "/model.safetensors.index.json")) return;
    const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
    std::filesystem::remove_all(tmp);
    RunResult r = run_cedar("make-tiny --out " + tmp + " --seed 0");
    if (r.exit_code != 0) {
      dir = "make-tiny failed: " + r.output;
      return;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, dir, ec);
    if (ec) std::filesystem::remove_all(tmp);
  });
  return dir;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

}  // namespace cedar::e2e
