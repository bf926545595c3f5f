#include "serve/api/json_body.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cedar::serve {
namespace {

using Members = OrderedJson::object_t::Container;  // std::vector<std::pair<const std::string, OrderedJson>>
using Elements = OrderedJson::array_t;

// Objects up to this many members find a duplicate key by scanning; larger ones keep an index.
constexpr size_t kScanMembers = 32;
// glibc's malloc adds about this much to every block; counted so the estimate follows real use.
constexpr size_t kBlockOverhead = 16;

// Heap bytes of a std::string of n chars beyond the object itself (none while it fits the SSO buffer).
size_t string_heap_bytes(size_t n) { return n > 15 ? n + 1 + kBlockOverhead : 0; }

std::string with_commas(size_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The element count of a container with more than kScanMembers elements; `ordinal` counts the
// containers in the order they open.
struct SizeHint {
  size_t ordinal;
  size_t count;
};

// One quick pass over the text's brackets and commas (strings skipped) that finds the large containers'
// sizes, so the DOM's vectors and key indexes are allocated once at their final size: growing them by
// doubling would hold the old and the new array at once, up to 1.5x the members' final bytes. Only a
// hint: on malformed text it may be wrong (every allocation is still charged), and the SAX pass
// reports the syntax error. Stops at max_depth (the SAX pass refuses that too).
std::vector<SizeHint> large_containers(std::string_view text, int max_depth) {
  struct Open {
    size_t ordinal;
    size_t commas = 0;
    bool empty = true;
  };
  std::vector<SizeHint> hints;
  std::vector<Open> stack;
  size_t ordinal = 0;
  bool stopped = false;
  scan_json_outside_strings(text, [&](char c) {
    switch (c) {
      case ' ':
      case '\t':
      case '\n':
      case '\r': break;
      case ',':
        if (!stack.empty()) ++stack.back().commas;
        break;
      case '{':
      case '[':
        if (!stack.empty()) stack.back().empty = false;
        if (static_cast<int>(stack.size()) >= max_depth) {
          stopped = true;
          return false;
        }
        stack.push_back({ordinal++});
        break;
      case '}':
      case ']': {
        if (stack.empty()) {
          stopped = true;
          return false;
        }
        const Open open = stack.back();
        stack.pop_back();
        const size_t count = open.empty ? 0 : open.commas + 1;
        if (count > kScanMembers) hints.push_back({open.ordinal, count});
        break;
      }
      default:  // a value's first character (a string's opening quote included)
        if (!stack.empty()) stack.back().empty = false;
        break;
    }
    return true;
  });
  if (stopped) return hints;
  // Containers close inner first; the SAX pass opens them outer first.
  std::sort(hints.begin(), hints.end(), [](const SizeHint& a, const SizeHint& b) { return a.ordinal < b.ordinal; });
  return hints;
}

// Builds the ordered_json DOM from nlohmann's SAX events (the interface sax_parse expects).
class BoundedDomBuilder {
 public:
  BoundedDomBuilder(size_t text_bytes, const JsonLimits& limits, std::string_view what,
                    const std::function<bool()>& cancelled, std::vector<SizeHint> hints)
      : limits_(limits),
        what_(what),
        cancelled_(cancelled),
        memory_budget_(limits.memory_factor * text_bytes + limits.memory_slack),
        hints_(std::move(hints)) {
    charge(hints_.capacity() * sizeof(SizeHint));
  }

  bool null() { return place(OrderedJson(nullptr)) != nullptr; }
  bool boolean(bool v) { return place(OrderedJson(v)) != nullptr; }
  bool number_integer(OrderedJson::number_integer_t v) { return place(OrderedJson(v)) != nullptr; }
  bool number_unsigned(OrderedJson::number_unsigned_t v) { return place(OrderedJson(v)) != nullptr; }
  bool number_float(OrderedJson::number_float_t v, const std::string&) { return place(OrderedJson(v)) != nullptr; }
  bool string(std::string& v) {
    if (!check_string(v, "string")) return false;
    // A string value is a heap std::string object plus its characters.
    if (!charge(sizeof(std::string) + kBlockOverhead + string_heap_bytes(v.size()))) return false;
    return place(OrderedJson(std::move(v))) != nullptr;
  }
  bool binary(OrderedJson::binary_t&) { return fail("binary values are not JSON"); }  // never from JSON text

  bool start_object(size_t) { return open(OrderedJson::object(), sizeof(OrderedJson::object_t)); }
  bool key(std::string& k) {
    if (!check_string(k, "key")) return false;
    key_ = std::move(k);
    // The index slot is fetched while the value is lexed: in a large object the lookup is a cache
    // miss, which otherwise is most of the time spent per member.
    key_hash_ = std::hash<std::string_view>{}(key_);
    if (const std::vector<uint32_t>& index = stack_.back().index; !index.empty())
      __builtin_prefetch(&index[key_hash_ & (index.size() - 1)]);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(size_t) { return open(OrderedJson::array(), sizeof(Elements)); }
  bool end_array() { return close(); }

  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) {
    return fail(what_ + " is not valid JSON (or not valid UTF-8) near byte " + std::to_string(position) +
                    "; send a JSON object",
                JsonError::Kind::kSyntax);
  }

  std::optional<JsonError> error() const { return error_; }
  OrderedJson take_root() { return std::move(root_); }
  JsonParseStats stats() const { return {values_, bytes_}; }

 private:
  // An open object or array; `index` maps a member key to its position + 1 (0: empty slot), built
  // once an object passes kScanMembers.
  struct Frame {
    OrderedJson* container;
    std::vector<uint32_t> index;
  };

  bool fail(std::string message, JsonError::Kind kind = JsonError::Kind::kLimit) {
    if (!error_) error_ = JsonError{kind, std::move(message)};
    return false;
  }

  bool charge(size_t bytes) {
    bytes_ += bytes;
    if (bytes_ <= memory_budget_) return true;
    return fail(what_ + " would take more than " + with_commas(memory_budget_) + " bytes once parsed (" +
                std::to_string(limits_.memory_factor) + " x its size + " + with_commas(limits_.memory_slack) +
                "): it holds too many small values for its size; send fewer, larger values");
  }

  bool check_string(const std::string& s, const char* kind) {
    if (s.size() <= limits_.max_string_bytes) return true;
    return fail(what_ + " has a " + kind + " of " + with_commas(s.size()) + " bytes; the limit is " +
                with_commas(limits_.max_string_bytes) + " bytes per string");
  }

  bool open(OrderedJson&& container, size_t container_bytes) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      return fail(what_ + " nests deeper than " + std::to_string(limits_.max_depth) +
                  " levels; flatten it to at most " + std::to_string(limits_.max_depth));
    if (!charge(container_bytes + kBlockOverhead)) return false;
    const size_t ordinal = containers_++;
    OrderedJson* slot = place(std::move(container));
    if (!slot) return false;
    stack_.push_back({slot, {}});
    if (next_hint_ < hints_.size() && hints_[next_hint_].ordinal == ordinal)
      return presize(stack_.back(), hints_[next_hint_++].count);
    return true;
  }

  // Allocates a large container (and an object's key index) at its final size; a size over a limit
  // is refused now, before any of its elements is built.
  bool presize(Frame& frame, size_t count) {
    if (values_ + count > limits_.max_values) return too_many_values();
    if (frame.container->is_array()) {
      if (!charge(count * sizeof(OrderedJson))) return false;
      frame.container->get_ptr<Elements*>()->reserve(count);
      return true;
    }
    // Repeated keys do not count against the limit, so an object past it is left to place() to refuse.
    if (count > limits_.max_object_keys) return true;
    if (!charge(count * sizeof(Members::value_type))) return false;
    Members& members = *frame.container->get_ptr<OrderedJson::object_t*>();
    members.reserve(count);
    return build_index(frame, members, count);
  }

  bool too_many_values() {
    return fail(what_ + " has more than " + with_commas(limits_.max_values) +
                " JSON values; this server's limit per body keeps parsing bounded");
  }
  bool too_many_keys() {
    return fail(what_ + " has an object with more than " + with_commas(limits_.max_object_keys) +
                " keys; this server's limit per object keeps parsing bounded");
  }

  bool close() {
    bytes_ -= stack_.back().index.capacity() * sizeof(uint32_t);  // the index is freed with the frame
    stack_.pop_back();
    return true;
  }

  // Puts a finished scalar or a new container where the next value goes; its address, or nullptr
  // after a limit was hit.
  OrderedJson* place(OrderedJson&& v) {
    if (error_) return nullptr;
    if (++values_ > limits_.max_values) {
      too_many_values();
      return nullptr;
    }
    if (values_ % kCancelCheckEvents == 0 && cancelled_ && cancelled_()) {
      fail("cancelled: the client left", JsonError::Kind::kCancelled);
      return nullptr;
    }
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& frame = stack_.back();
    if (frame.container->is_array()) {
      Elements& elements = *frame.container->get_ptr<Elements*>();
      const size_t capacity = elements.capacity();
      elements.push_back(std::move(v));
      if (!charge((elements.capacity() - capacity) * sizeof(OrderedJson))) return nullptr;
      return &elements.back();
    }
    Members& members = *frame.container->get_ptr<OrderedJson::object_t*>();
    if (const size_t at = find(frame, members); at < members.size()) {
      members[at].second = std::move(v);  // a repeated key: first position, last value
      return &members[at].second;
    }
    if (members.size() >= limits_.max_object_keys) {
      too_many_keys();
      return nullptr;
    }
    const size_t capacity = members.capacity();
    const size_t key_bytes = string_heap_bytes(key_.size());
    members.emplace_back(std::move(key_), std::move(v));
    if (!charge(key_bytes + (members.capacity() - capacity) * sizeof(Members::value_type))) return nullptr;
    if (!index_last(frame, members)) return nullptr;
    return &members.back().second;
  }


  // The position of key_ among the members, or members.size().
  size_t find(const Frame& frame, const Members& members) const {
    if (frame.index.empty()) {
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i].first == key_) return i;
      return members.size();
    }
    const size_t mask = frame.index.size() - 1;
    for (size_t s = key_hash_ & mask;; s = (s + 1) & mask) {
      const uint32_t entry = frame.index[s];
      if (entry == 0) return members.size();
      if (members[entry - 1].first == key_) return entry - 1;
    }
  }

  // Adds the member just appended to the index: built once an object passes kScanMembers (or at
  // its final size by presize), rebuilt twice as large past a load of 3/4, so probes stay short.
  bool index_last(Frame& frame, const Members& members) {
    if (frame.index.empty() && members.size() <= kScanMembers) return true;
    if (members.size() * 4 > frame.index.size() * 3) return build_index(frame, members, members.size());
    insert(frame, key_hash_, static_cast<uint32_t>(members.size()));
    return true;
  }

  // An index of at least 2 x `room` slots holding the members so far.
  bool build_index(Frame& frame, const Members& members, size_t room) {
    size_t slots = 64;
    while (slots < room * 2) slots *= 2;
    if (slots > frame.index.size() && !charge((slots - frame.index.size()) * sizeof(uint32_t))) return false;
    frame.index.assign(slots, 0);
    for (size_t i = 0; i < members.size(); ++i)
      insert(frame, std::hash<std::string_view>{}(members[i].first), static_cast<uint32_t>(i + 1));
    return true;
  }

  static void insert(Frame& frame, size_t hash, uint32_t entry) {
    const size_t mask = frame.index.size() - 1;
    size_t s = hash & mask;
    while (frame.index[s] != 0) s = (s + 1) & mask;
    frame.index[s] = entry;
  }

  const JsonLimits& limits_;
  const std::string what_;
  const std::function<bool()>& cancelled_;
  const size_t memory_budget_;
  size_t bytes_ = 0;
  size_t values_ = 0;
  std::vector<Frame> stack_;
  std::string key_;
  size_t key_hash_ = 0;  // of key_
  std::vector<SizeHint> hints_;
  size_t next_hint_ = 0;
  size_t containers_ = 0;  // opened so far: the ordinal of the next
  OrderedJson root_;
  std::optional<JsonError> error_;
};

}  // namespace

std::optional<JsonError> parse_json_bounded(std::string_view text, const JsonLimits& limits, OrderedJson* out,
                                              std::string_view what, const std::function<bool()>& cancelled,
                                              JsonParseStats* stats) {
  BoundedDomBuilder builder(text.size(), limits, what, cancelled, large_containers(text, limits.max_depth));
  const bool ok = OrderedJson::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json,
                                         /*strict=*/true, /*ignore_comments=*/false);
  if (stats) *stats = builder.stats();
  if (!ok) {
    if (std::optional<JsonError> error = builder.error()) return error;
    return JsonError{JsonError::Kind::kSyntax, std::string(what) + " is not valid JSON; send a JSON object"};
  }
  *out = builder.take_root();
  return std::nullopt;
}

}  // namespace cedar::serve
