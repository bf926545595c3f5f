// The ExpertExchange over MPI point-to-point messages (docs/DISTRIBUTED.md "Protocol").
//
// A request (tag kTagRequest, head -> worker) is one byte message:
//   int32 {layer, n_tokens, n_experts, n_rows, x_format}, int32 experts[n_experts],
//   int32 counts[n_experts], int32 row_token[n_rows], float row_weight[n_rows], x[n_tokens * dim]
// x travels as bf16 (x_format 1) when every value is bf16-exact, which the FFN input always is (its
// RMSNorm rounds to bf16): half the bytes, no change in value; else as fp32 (x_format 0).
// layer -1 is the stop message (the header alone). A reply (kTagReply, worker -> head) is
// float out[n_rows * dim], the per-(token, expert) outputs in the request's row order.
// MPI keeps the order of messages between two ranks with one tag, so replies need no ids.
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "dist/mpi_internal.h"

namespace cedar::dist {
namespace {

constexpr int32_t kStop = -1;  // a request whose layer is -1

class MpiExchange final : public model::ExpertExchange {
 public:
  MpiExchange(int rank, int size, const ExpertPlacement& p, size_t dim, double timeout_s,
              std::function<std::string(int)> describe, std::shared_ptr<ExchangeCounters> counters)
      : rank_(rank), size_(size), placement_(p), dim_(dim), timeout_s_(timeout_s), describe_(std::move(describe)),
        counters_(std::move(counters)),
        send_(size), reply_(size), send_req_(size, MPI_REQUEST_NULL), recv_req_(size, MPI_REQUEST_NULL),
        layer_(size, -1) {}

  int rank() const override { return rank_; }
  int n_ranks() const override { return size_; }
  int owner(int layer, int expert) const override { return placement_.owner_of(layer, expert); }

  Status post(std::span<const model::ExpertBatch> per_rank) override { return note(post_impl(per_rank)); }
  Status collect(int r, std::span<float> out) override {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = collect_impl(r, out);
    counters_->wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok()) counters_->bytes_received += out.size() * sizeof(float);
    return note(st);
  }
  Result<bool> next(model::ExpertBatch& b) override {
    Result<bool> got = next_impl(b);
    if (!got.ok()) counters_->failed = true;
    return got;
  }
  Status reply(std::span<const float> out) override { return note(reply_impl(out)); }

 private:
  Status note(Status st) {
    if (!st.ok()) counters_->failed = true;
    return st;
  }

  Status post_impl(std::span<const model::ExpertBatch> per_rank) {
    for (int r = 0; r < size_; ++r) {
      const model::ExpertBatch& b = per_rank[r];
      if (r == rank_ || b.rows() == 0) continue;
      pack(b, send_[r]);
      reply_[r].resize(b.rows() * dim_);
      layer_[r] = b.layer;
      // The reply's receive is posted first, so that it can land while this rank computes.
      if (int rc = MPI_Irecv(reply_[r].data(), static_cast<int>(reply_[r].size()), MPI_FLOAT, r, kTagReply,
                             MPI_COMM_WORLD, &recv_req_[r]);
          rc != MPI_SUCCESS)
        return failed(r, "posting the receive of layer " + std::to_string(b.layer) + "'s expert outputs", rc);
      if (int rc = MPI_Isend(send_[r].data(), static_cast<int>(send_[r].size()), MPI_BYTE, r, kTagRequest,
                             MPI_COMM_WORLD, &send_req_[r]);
          rc != MPI_SUCCESS)
        return failed(r, "sending layer " + std::to_string(b.layer) + "'s expert request", rc);
      counters_->requests += 1;
      counters_->bytes_sent += send_[r].size();
    }
    return {};
  }

  Status collect_impl(int r, std::span<float> out) {
    MPI_Request reqs[2] = {send_req_[r], recv_req_[r]};
    Status st = wait_bounded(reqs, [r](size_t) { return r; }, timeout_s_,
                             "layer " + std::to_string(layer_[r]) + "'s expert exchange", describe_);
    send_req_[r] = reqs[0];
    recv_req_[r] = reqs[1];
    CEDAR_RETURN_IF_ERROR(st);
    if (out.size() != reply_[r].size())
      return internal_error("expert exchange: " + describe_(r) + " replied " + std::to_string(reply_[r].size()) +
                            " floats, expected " + std::to_string(out.size()));
    std::memcpy(out.data(), reply_[r].data(), out.size() * sizeof(float));
    return {};
  }

  Result<bool> next_impl(model::ExpertBatch& b) {
    // Idle between requests for as long as the head has no work (a server between requests): no
    // deadline here; a dead head ends the job through mpirun.
    MPI_Message msg;
    MPI_Status st;
    int found = 0;
    auto nap = std::chrono::microseconds(20);
    for (int polls = 0;; ++polls) {
      if (int rc = MPI_Improbe(0, kTagRequest, MPI_COMM_WORLD, &found, &msg, &st); rc != MPI_SUCCESS)
        return failed(0, "waiting for the next expert request", rc);
      if (found) break;
      if (polls > 64) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    }
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    recv_.resize(static_cast<size_t>(bytes));
    MPI_Request req = MPI_REQUEST_NULL;
    if (int rc = MPI_Imrecv(recv_.data(), bytes, MPI_BYTE, &msg, &req); rc != MPI_SUCCESS)
      return failed(0, "receiving an expert request", rc);
    CEDAR_RETURN_IF_ERROR(wait_bounded({&req, 1}, [](size_t) { return 0; }, timeout_s_, "receiving an expert request",
                                       describe_));
    return unpack(recv_, b);
  }

  Status reply_impl(std::span<const float> out) {
    MPI_Request req = MPI_REQUEST_NULL;
    if (int rc = MPI_Isend(out.data(), static_cast<int>(out.size()), MPI_FLOAT, 0, kTagReply, MPI_COMM_WORLD, &req);
        rc != MPI_SUCCESS)
      return failed(0, "sending expert outputs", rc);
    return wait_bounded({&req, 1}, [](size_t) { return 0; }, timeout_s_, "sending expert outputs", describe_);
  }

  Status failed(int r, const std::string& what, int rc) const {
    return Status(StatusCode::kIo, describe_(r) + ": " + what + " failed: " + mpi_error_text(rc));
  }

  void pack(const model::ExpertBatch& b, std::vector<uint8_t>& buf) const {
    bool bf16 = true;
    for (float v : b.x) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (bits & 0xffffu) {
        bf16 = false;
        break;
      }
    }
    const int32_t hdr[5] = {b.layer, b.n_tokens, static_cast<int32_t>(b.experts.size()),
                            static_cast<int32_t>(b.rows()), bf16 ? 1 : 0};
    buf.clear();
    auto put = [&](const void* p, size_t n) {
      const auto* c = static_cast<const uint8_t*>(p);
      buf.insert(buf.end(), c, c + n);
    };
    put(hdr, sizeof hdr);
    put(b.experts.data(), b.experts.size() * 4);
    put(b.counts.data(), b.counts.size() * 4);
    put(b.row_token.data(), b.row_token.size() * 4);
    put(b.row_weight.data(), b.row_weight.size() * 4);
    if (!bf16) {
      put(b.x.data(), b.x.size() * 4);
      return;
    }
    const size_t at = buf.size();
    buf.resize(at + b.x.size() * 2);
    for (size_t i = 0; i < b.x.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &b.x[i], 4);
      const uint16_t hi = static_cast<uint16_t>(bits >> 16);
      std::memcpy(buf.data() + at + 2 * i, &hi, 2);
    }
  }

  Result<bool> unpack(const std::vector<uint8_t>& buf, model::ExpertBatch& b) const {
    int32_t hdr[5] = {};
    if (buf.size() >= 4 && std::memcmp(buf.data(), &kStop, 4) == 0) return false;
    if (buf.size() < sizeof hdr) return invalid_argument("expert worker: a request shorter than its header");
    std::memcpy(hdr, buf.data(), sizeof hdr);
    const size_t x_bytes = hdr[4] == 1 ? 2 : 4;
    const size_t n_tokens = static_cast<size_t>(std::max(hdr[1], 0)), n_experts = static_cast<size_t>(std::max(hdr[2], 0)),
                 n_rows = static_cast<size_t>(std::max(hdr[3], 0));
    if ((hdr[4] != 0 && hdr[4] != 1) ||
        buf.size() != sizeof hdr + 4 * (2 * n_experts + 2 * n_rows) + x_bytes * n_tokens * dim_)
      return invalid_argument("expert worker: a request of " + std::to_string(buf.size()) +
                              " bytes does not match its header (another cedar version or model on the head?)");
    b.clear();
    b.layer = hdr[0];
    b.n_tokens = static_cast<int32_t>(n_tokens);
    size_t at = sizeof hdr;
    auto get = [&](auto& v, size_t n) {
      v.resize(n);
      std::memcpy(v.data(), buf.data() + at, n * 4);
      at += n * 4;
    };
    get(b.experts, n_experts);
    get(b.counts, n_experts);
    get(b.row_token, n_rows);
    get(b.row_weight, n_rows);
    if (x_bytes == 4) {
      get(b.x, n_tokens * dim_);
      return true;
    }
    b.x.resize(n_tokens * dim_);
    for (size_t i = 0; i < b.x.size(); ++i) {
      uint16_t hi;
      std::memcpy(&hi, buf.data() + at + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(hi) << 16;
      std::memcpy(&b.x[i], &bits, 4);
    }
    return true;
  }

  int rank_, size_;
  ExpertPlacement placement_;
  size_t dim_;
  double timeout_s_;
  std::function<std::string(int)> describe_;
  std::shared_ptr<ExchangeCounters> counters_;  // shared with the Cluster, which reports them
  std::vector<std::vector<uint8_t>> send_;
  std::vector<std::vector<float>> reply_;
  std::vector<MPI_Request> send_req_, recv_req_;
  std::vector<int> layer_;
  std::vector<uint8_t> recv_;
};

}  // namespace

std::unique_ptr<model::ExpertExchange> make_mpi_exchange(int rank, int size, const ExpertPlacement& placement,
                                                         size_t dim, double timeout_s,
                                                         std::function<std::string(int)> describe,
                                                         std::shared_ptr<ExchangeCounters> counters) {
  return std::make_unique<MpiExchange>(rank, size, placement, dim, timeout_s, std::move(describe), std::move(counters));
}

}  // namespace cedar::dist
