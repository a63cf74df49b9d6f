// train_mnist's checkpoints, which a kill cannot tear: one file per rank and step (PATH.step<S>.rank<R>), since each
// rank's momentum (and, under the averaging methods, its parameters) is its own. A file is written to a temporary
// name and synced; only when every rank holds its new file whole does each rename its own into place, and each keeps
// its two newest steps, so that a rank killed between the others' renames and its own still shares the step before.
// On resume the ranks agree on the newest step every one of them holds, from one run (a run's id is drawn at its
// fresh start and carried through its resumes), and all load it or all fail, naming the ranks and files.
// A file is trusted only when it is a regular file (not a FIFO, a device or a symlink) whose header parses with every
// count in range and whose size is exactly what the header says; any other file is named in a warning and skipped,
// never counted as a save nor deleted.
//
// A file (version 3) is a two-line text header, then the data in the machine's byte order:
//   hopwise-train_mnist-checkpoint 3\n
//   STEPS RANKS BATCH RUN COUNT AVERAGING_BYTES\n
//   COUNT float32 parameters, COUNT float32 momentum values, AVERAGING_BYTES of ModelAverager::save()
// The averaging state is binary (diloco's synced model, momentum, residuals, a fragment in flight: megabytes, with
// newlines and NULs), so it follows the arrays rather than sitting in the header (version 2 held it as a third line).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hopwise/comm/communicator.h"

namespace hopwise::examples {

struct Checkpoint {
  std::int64_t steps_done = 0;  // optimizer steps since the run's start: where training resumes
  int ranks = 0;
  int batch = 0;          // the global batch, which fixes what a step is
  std::uint64_t run = 0;  // the run's id (new_run_id at a fresh start)
  std::string averaging;  // ModelAverager::save(): binary, after the momentum in the file
};

// A checkpoint file's header as read back: what the file says it holds, and where its data starts.
struct CheckpointHeader {
  Checkpoint c;                       // c.averaging empty: the state is read from after the momentum
  std::size_t count = 0;              // parameters, then as many momentum values, after the header
  std::uint64_t averaging_bytes = 0;  // the averaging state's bytes, after the momentum
  std::size_t length = 0;             // the header's bytes: where the parameters start
  std::uint64_t file_size() const { return length + 2 * std::uint64_t{count} * sizeof(float) + averaging_bytes; }
};

// Past these a header is not one of ours. 2^30 steps is more than any run of this example takes, and keeps the
// trainer's arithmetic (the epoch, steps / steps per epoch, is an int; the position is 2 * steps) in range for every
// steps per epoch >= 1; 2^36 parameters (256 GiB) is past any model's.
inline constexpr std::int64_t kMaxCheckpointSteps = std::int64_t{1} << 30;
inline constexpr int kMaxCheckpointRanks = 1 << 20;
inline constexpr std::size_t kMaxCheckpointCount = std::size_t{1} << 36;
inline constexpr std::size_t kMaxCheckpointHeader = 4096;  // bytes read for a header: two short lines
// The averaging state a model of `count` parameters may come with: every method keeps at most five copies of the
// model beside it (diloco: the synced model, momentum, the codec's residuals, a fragment's send and receive
// buffers), and a little text. A header asking for more is not ours: what it says is allocated on a resume.
constexpr std::uint64_t max_averaging_bytes(std::size_t count) {
  return 8 * std::uint64_t{count} * sizeof(float) + (std::uint64_t{1} << 20);
}

// The header's text as save_checkpoint writes it, for an averaging state of `averaging_bytes` (c.averaging itself
// is not written here: it follows the momentum).
std::string checkpoint_header_text(const Checkpoint& c, std::size_t count, std::uint64_t averaging_bytes);
// The header at the start of `bytes` (a file's first bytes; what follows the header is not looked at), or nullopt
// where it is not a header of this version, a count is out of range (the averaging state's bytes above
// max_averaging_bytes(count) among them) or it does not end within kMaxCheckpointHeader.
// Pure: libFuzzer calls it (tests/fuzz/fuzz_checkpoint_header.cpp).
std::optional<CheckpointHeader> parse_checkpoint_header(std::string_view bytes);

std::string checkpoint_path(const std::string& base, std::int64_t step, int rank);
// A fresh run's id, alike on every rank (rank 0's draw). Collective.
std::uint64_t new_run_id(comm::Communicator& comm);
// Every rank writes its file for c.steps_done; when all have, each renames its own into place, syncs the directory
// and removes its files older than the step before (its valid ones only: see remove_older_saves). Error on every rank,
// naming the ranks that failed, when some rank could not write (the last checkpoint stands). Collective.
void save_checkpoint(comm::Communicator& comm, const std::string& base, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count);
// Loads the newest step every rank holds whole, of one run, its averaging state into Checkpoint::averaging. When no
// rank holds a file: nullopt (a fresh start). InvalidArgument on every rank, naming ranks, steps and files, when some
// rank holds files but no step is common, when the common step's files are of different runs, or when a file does not
// fit this model. Collective.
std::optional<Checkpoint> load_newest_checkpoint(comm::Communicator& comm, const std::string& base, float* params,
                                                 float* velocity, std::size_t count);

}  // namespace hopwise::examples
