// Error types. Every message says what was wrong and what to do about it.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace hopwise {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something invalid (null buffer, bad root, unknown name, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wait ran past HOPWISE_TIMEOUT_S; `pending_ranks` are the peers that never answered.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, std::vector<int> pending_ranks)
      : Error(what), pending_ranks_(std::move(pending_ranks)) {}
  const std::vector<int>& pending_ranks() const { return pending_ranks_; }

 private:
  std::vector<int> pending_ranks_;
};

// The transport below (MPI, UCX, NCCL) reported a failure; `failed_ranks` are the peers it names, where known
// (a UCX endpoint that failed because its peer died).
class TransportError : public Error {
 public:
  using Error::Error;
  TransportError(const std::string& what, std::vector<int> failed_ranks)
      : Error(what), failed_ranks_(std::move(failed_ranks)) {}
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

 private:
  std::vector<int> failed_ranks_;
};

}  // namespace hopwise
