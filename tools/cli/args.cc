#include "args.h"

#include <cerrno>
#include <cstdlib>

namespace cedar::cli {

Result<Args> Args::parse(const std::vector<std::string>& argv,
                         const std::set<std::string>& value_flags,
                         const std::set<std::string>& bool_flags,
                         const std::map<std::string, std::string>& aliases,
                         const std::set<std::string>& list_flags) {
  Args out;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (a.size() < 2 || a[0] != '-') {
      out.positional_.push_back(a);
      continue;
    }
    std::string value;
    bool has_inline = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    if (auto it = aliases.find(a); it != aliases.end()) a = it->second;
    if (bool_flags.count(a)) {
      if (has_inline) return invalid_argument("flag " + a + " takes no value");
      out.values_[a] = "1";
    } else if (list_flags.count(a)) {
      auto& list = out.lists_[a];
      if (has_inline) list.push_back(value);
      while (i + 1 < argv.size() && !(argv[i + 1].size() >= 2 && argv[i + 1][0] == '-')) list.push_back(argv[++i]);
      if (list.empty()) return invalid_argument("flag " + a + " needs at least one value");
      out.values_[a] = list.front();
    } else if (value_flags.count(a)) {
      if (!has_inline) {
        if (i + 1 >= argv.size()) return invalid_argument("flag " + a + " needs a value");
        value = argv[++i];
      }
      out.values_[a] = value;
    } else {
      return invalid_argument("unknown flag " + a + " (see --help)");
    }
  }
  return out;
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Args::get_list(const std::string& flag) const {
  auto it = lists_.find(flag);
  return it == lists_.end() ? std::vector<std::string>{} : it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& fallback) const {
  auto v = get(flag);
  return v ? *v : fallback;
}

Result<long long> Args::get_int(const std::string& flag, long long fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno || end == v->c_str() || *end) return invalid_argument(flag + " expects an integer, got '" + *v + "'");
  return x;
}

Result<double> Args::get_double(const std::string& flag, double fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (errno || end == v->c_str() || *end) return invalid_argument(flag + " expects a number, got '" + *v + "'");
  return x;
}

}  // namespace cedar::cli
