// Internals of the dist module shared by cluster.cc and mpi_exchange.cc (includes mpi.h).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "dist/cluster.h"
#include "dist/placement.h"
#include "model/expert_exchange.h"

namespace cedar::dist {

inline constexpr int kTagRequest = 11, kTagReply = 12, kTagPlacement = 13;

// Waits until every request completes, polling MPI_Test (a blocking MPI wait could never time out),
// for at most timeout_s. peer(i): the rank request i talks to, for the message; what: the exchange.
// Errors name the first request's peer that failed or had not completed, via describe(rank).
Status wait_bounded(std::span<MPI_Request> requests, const std::function<int(size_t)>& peer, double timeout_s,
                    const std::string& what, const std::function<std::string(int)>& describe);

std::string mpi_error_text(int code);

std::unique_ptr<model::ExpertExchange> make_mpi_exchange(int rank, int size, const ExpertPlacement& placement,
                                                         size_t dim, double timeout_s,
                                                         std::function<std::string(int)> describe,
                                                         std::shared_ptr<ExchangeCounters> counters);

}  // namespace cedar::dist
