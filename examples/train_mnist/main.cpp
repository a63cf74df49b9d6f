// train_mnist: data-parallel training of an MLP on Fashion-MNIST, each layer's gradient handed to hopwise's
// bucketed reducer as soon as backward produces it, and the model averaged as --averaging says.
//   mpirun -np 4 build/bin/train_mnist --epochs 5 [--averaging local:period=8] [--target-accuracy 0.85]
// The flags are flags.cpp, the loop trainer.cpp.
#include <fmt/core.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#if defined(__SSE__) || defined(__x86_64__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include "flags.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/common/error.h"
#include "hopwise/training/elastic.h"
#include "trainer.h"

namespace {

namespace ex = hopwise::examples;

// SIGTERM is how a scheduler stops a job (scancel, a time limit, a preemption; torchrun and mpirun too): the rank
// says so in one line before it goes, so that a log tells a stopped job from a crashed one. Formatted before, as a
// handler may only write.
char sigterm_line[160];

extern "C" void on_sigterm(int sig) {
  const ssize_t written = ::write(STDERR_FILENO, sigterm_line, std::strlen(sigterm_line));
  (void)written;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void say_why_on_sigterm(int rank) {
  std::snprintf(sigterm_line, sizeof sigterm_line,
                "train_mnist: rank %d got SIGTERM (scancel, a time limit or a preemption): stopping; resume with "
                "--checkpoint ... --resume auto\n",
                rank);
  std::signal(SIGTERM, on_sigterm);
}

int run(int argc, char** argv) {
  // HOPWISE_ELASTIC=shrink|grow: the ranks form an elastic group (over a store; UCX), whose survivors carry on and
  // which processes started later (HOPWISE_ELASTIC_JOIN=1) join.
  const auto elastic_options = hopwise::comm::ElasticOptions::from_env();
  std::unique_ptr<hopwise::comm::ElasticGroup> elastic;
  std::unique_ptr<hopwise::comm::Communicator> plain;
  if (elastic_options.shrink || elastic_options.grow)
    elastic = hopwise::comm::ElasticGroup::from_launch(elastic_options);
  else
    plain = std::make_unique<hopwise::comm::Communicator>();
  hopwise::comm::Communicator& comm = elastic ? elastic->comm() : *plain;
  const int rank = comm.rank(), p = comm.size();
  say_why_on_sigterm(rank);
  ex::Flags f;
  try {
    f = ex::parse_flags(argc, argv);
    if (f.batch < p)  // a batch the ranks do not divide is shared as evenly as it goes (Trainer::split_batch)
      throw hopwise::InvalidArgument(
          fmt::format("--batch {} leaves some of the {} ranks without an image; use at least {}", f.batch, p, p));
  } catch (const hopwise::InvalidArgument& e) {
    if (rank == 0) std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 2;
  }
  if (f.straggler >= p) {
    if (rank == 0)
      std::fprintf(stderr, "train_mnist: --straggle rank %d: the job has ranks 0-%d\n", f.straggler, p - 1);
    return 2;
  }
  ex::Trainer trainer(comm, std::move(f), elastic.get());
  trainer.print_plan();
  trainer.train();
  trainer.report();
  return 0;
}

}  // namespace

#ifdef HOPWISE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

// Denormal floats are flushed to zero (FTZ) and read as zero (DAZ): a torch run slowed 2x after ~900 steps, as
// weights and gradients decayed into denormals, until they were flushed. Set here, before the communicator exists,
// so that every thread started after inherits it (pthread_create copies the creator's MXCSR): the main thread's
// forward, backward and optimizer step, the communicator's progress thread (its reductions and the averager's
// background all-reduces) and MPI's own. x86 only; elsewhere nothing is changed. --keep-denormals leaves them.
void flush_denormals(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--keep-denormals") return;
#if defined(__SSE__) || defined(__x86_64__)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
}

int main(int argc, char** argv) {
  flush_denormals(argc, argv);
#ifdef HOPWISE_OPENBLAS
  // One BLAS thread per rank: the cores are shared with the other ranks and each communicator's progress thread.
  if (!std::getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
#endif
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 1;
  }
}
