// A store in a directory every rank can see (a local disk for ranks on one host, a shared file system across
// hosts): a key is a file, written whole under a fresh name (O_EXCL) and renamed into place, so a reader never
// sees half a value and two writers never share a temporary file; add() holds a lock on the directory's lock
// file. The directory belongs to one launch of one job: the claiming rank records the job, the attempt (torchrun's
// restart count) and a claim of its own; it clears the keys of an earlier attempt of its job, and refuses a
// directory holding another job's keys or those of an earlier run (stale files). It trusts nothing in the
// directory: a directory others may write (without the sticky bit) or own is refused, and every file is opened
// relative to it, never through a link, and read only when it is a regular file of this user.
#pragma once

#include <string>

#include "hopwise/comm/store.h"

namespace hopwise::comm {

class FileStore final : public Store {
 public:
  // claim (one rank, e.g. rank 0): create `dir` if needed and record `job` and `attempt` in it; Error when the
  // directory holds another job's keys, keys of no recorded job, or keys of an earlier run of this job and
  // attempt (a run that did not end cleanly). The keys of an earlier attempt of this job are removed. The other
  // ranks wait up to `timeout` for the claim (TimeoutError naming the directory) and refuse another job's.
  // InvalidArgument when the directory is writable by other users without the sticky bit, or owned by another.
  FileStore(std::string dir, bool claim, std::string job, Seconds timeout = Seconds(300), int attempt = 0);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  // Error naming the key's file when it holds anything but an integer, or the sum would overflow.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& dir() const { return dir_; }
  // This rank is done with the store (each of `size` ranks calls it once, at a clean exit): the last one removes
  // the keys and the record, so that the next run finds a clean directory.
  void leave(int size);

 private:
  std::string name_of(const std::string& key) const;
  void write_file(const std::string& name, const std::string& value) const;
  void remove_keys() const;
  void close_dir();
  std::string dir_;
  int dir_fd_ = -1;  // every file is opened relative to it (openat)
};

}  // namespace hopwise::comm
