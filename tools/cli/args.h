// A small flag parser for subcommands: --name value, --name=value, -x value, and boolean flags.
// Unknown flags are errors (a typo must not be silently ignored).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cedar/status.h"

namespace cedar::cli {

class Args {
 public:
  // `value_flags` take a value; `bool_flags` do not. Names include the dashes ("--out", "-m").
  // `aliases` maps a short name to its long name ("-m" -> "--model").
  // `list_flags` take one or more values: every following argument up to the next flag
  // (--files a.txt b.txt); given twice, the lists are joined.
  static Result<Args> parse(const std::vector<std::string>& argv,
                            const std::set<std::string>& value_flags,
                            const std::set<std::string>& bool_flags,
                            const std::map<std::string, std::string>& aliases = {},
                            const std::set<std::string>& list_flags = {});

  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& fallback) const;
  // Parses an integer / float flag; an unparsable value is an InvalidArgument naming the flag.
  Result<long long> get_int(const std::string& flag, long long fallback) const;
  Result<double> get_double(const std::string& flag, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::vector<std::string> get_list(const std::string& flag) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;
  std::vector<std::string> positional_;
};

}  // namespace cedar::cli
