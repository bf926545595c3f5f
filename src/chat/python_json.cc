#include "chat/python_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cedar::chat {
namespace {

using ojson = nlohmann::ordered_json;

void append_python_string(const std::string& s, std::string* out) {
  out->push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void dump(const ojson& v, std::string* out) {
  switch (v.type()) {
    case ojson::value_t::null: out->append("null"); break;
    case ojson::value_t::boolean: out->append(v.get<bool>() ? "true" : "false"); break;
    case ojson::value_t::number_integer: out->append(std::to_string(v.get<int64_t>())); break;
    case ojson::value_t::number_unsigned: out->append(std::to_string(v.get<uint64_t>())); break;
    case ojson::value_t::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(python_float_repr(d));
      }
      break;
    }
    case ojson::value_t::string: append_python_string(v.get_ref<const std::string&>(), out); break;
    case ojson::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out->append(", ");
        first = false;
        dump(item, out);
      }
      out->push_back(']');
      break;
    }
    case ojson::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out->append(", ");
        first = false;
        append_python_string(it.key(), out);
        out->append(": ");
        dump(it.value(), out);
      }
      out->push_back('}');
      break;
    }
    case ojson::value_t::binary:
    case ojson::value_t::discarded: out->append("null"); break;
  }
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits and exponent, then Python's layout rules for repr():
  // exponent notation when the decimal point falls before -4 or after 16 digits.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = sign;
  if (v == 0.0) return sign + "0.0";
  if (decpt <= -4 || decpt > 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string python_json_dumps(const ojson& value) {
  std::string out;
  dump(value, &out);
  return out;
}

Result<std::string> python_str(const ojson& value, const std::string& what) {
  switch (value.type()) {
    case ojson::value_t::string: return value.get<std::string>();
    case ojson::value_t::null: return std::string("None");
    case ojson::value_t::boolean: return std::string(value.get<bool>() ? "True" : "False");
    case ojson::value_t::number_integer: return std::to_string(value.get<int64_t>());
    case ojson::value_t::number_unsigned: return std::to_string(value.get<uint64_t>());
    case ojson::value_t::number_float: return python_float_repr(value.get<double>());
    default:
      return invalid_argument(what + " must be a string (got a JSON " + std::string(value.type_name()) + ")");
  }
}

bool python_truthy(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return false;
    case ojson::value_t::boolean: return v.get<bool>();
    case ojson::value_t::number_integer: return v.get<int64_t>() != 0;
    case ojson::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case ojson::value_t::number_float: return v.get<double>() != 0.0;
    case ojson::value_t::string: return !v.get_ref<const std::string&>().empty();
    case ojson::value_t::array:
    case ojson::value_t::object: return !v.empty();
    default: return false;
  }
}

}  // namespace cedar::chat
