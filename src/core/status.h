// Status and Result<T>: how cedar reports environment and input errors (a bad file, a hostile
// request, a full disk). Bugs use CEDAR_CHECK (check.h) instead. No exception crosses a module
// boundary; third-party throws are caught at the adapter and turned into a Status.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace cedar {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller passed something malformed (request, CLI flag, config field)
  kNotFound,          // a file, tensor or key is missing
  kDataLoss,          // a file is corrupt or truncated
  kFailedPrecondition,// the state does not allow this (e.g. model not loaded)
  kResourceExhausted, // memory, disk or queue is full
  kUnimplemented,     // a feature the input asks for that cedar does not support
  kInternal,          // an invariant broke in a way that is not the caller's fault
  kIo,                // an OS call failed (errno text in the message)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DataLoss: shard model-00001.safetensors: ..." for logs and CLI output.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
// An OS error: appends strerror(err) to the message.
Status io_error(std::string m, int err);

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                       // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}                // NOLINT(implicit)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace cedar

#define CEDAR_CONCAT_INNER_(a, b) a##b
#define CEDAR_CONCAT_(a, b) CEDAR_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not ok.
#define CEDAR_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::cedar::Status _cedar_st = (expr);             \
    if (!_cedar_st.ok()) return _cedar_st;          \
  } while (0)

// CEDAR_ASSIGN_OR_RETURN(auto x, make_x()); binds the value or returns the Status.
#define CEDAR_ASSIGN_OR_RETURN(lhs, expr) \
  CEDAR_ASSIGN_OR_RETURN_IMPL_(CEDAR_CONCAT_(_cedar_res_, __LINE__), lhs, expr)
#define CEDAR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
