// A store in a directory every rank can see (a local disk for ranks on one host, a shared file system across
// hosts): a key is a file, written whole and renamed into place, so a reader never sees half a value; add() holds
// a lock on the directory's lock file. The directory belongs to one job: the claiming rank records the job, and
// a directory holding another job's keys (stale files) is refused, not trusted.
#pragma once

#include <string>

#include "hopwise/comm/store.h"

namespace hopwise::comm {

class FileStore final : public Store {
 public:
  // claim (one rank, e.g. rank 0): create `dir` if needed and record `job` in it; Error when the directory
  // already holds another job's keys or keys of no recorded job. The other ranks wait up to `timeout` for the
  // claim (TimeoutError naming the directory) and refuse a directory claimed by another job.
  FileStore(std::string dir, bool claim, std::string job, Seconds timeout = Seconds(300));

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& dir() const { return dir_; }

 private:
  std::string path_of(const std::string& key) const;
  void write_file(const std::string& path, const std::string& value) const;
  std::string dir_;
};

}  // namespace hopwise::comm
