// libFuzzer target: train_mnist's checkpoint headers (parse_checkpoint_header, examples/train_mnist/checkpoint.cpp),
// the first bytes of a file that may be anyone's. An accepted header must hold every count in its range (the
// averaging state's bytes within the model's bound: a resume allocates them), end within the bytes given and the
// cap, and read back the same from the text save_checkpoint would write for it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint.h"
#include "fuzz_common.h"

namespace {

using namespace hopwise::examples;

bool same(const CheckpointHeader& a, const CheckpointHeader& b) {
  return a.c.steps_done == b.c.steps_done && a.c.ranks == b.c.ranks && a.c.batch == b.c.batch && a.c.run == b.c.run &&
         a.c.averaging.empty() && b.c.averaging.empty() && a.count == b.count && a.averaging_bytes == b.averaging_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = hopwise::fuzz::as_text(data, size);
  const auto h = parse_checkpoint_header(bytes);
  if (!h) return 0;  // not a checkpoint of ours: the documented refusal
  const std::string head(bytes.substr(0, std::min(bytes.size(), kMaxCheckpointHeader)));
  if (h->c.steps_done < 0 || h->c.steps_done > kMaxCheckpointSteps || h->c.ranks < 1 ||
      h->c.ranks > kMaxCheckpointRanks || h->c.batch < 1 || h->count < 1 || h->count > kMaxCheckpointCount ||
      h->averaging_bytes > max_averaging_bytes(h->count))
    hopwise::fuzz::broken("a header was accepted with a count out of range", head);
  if (h->length > bytes.size() || h->length > kMaxCheckpointHeader || bytes[h->length - 1] != '\n')
    hopwise::fuzz::broken("an accepted header does not end with a newline within the bytes and the cap", head);
  const std::string text = checkpoint_header_text(h->c, h->count, h->averaging_bytes);
  const auto again = parse_checkpoint_header(text);
  if (!again || !same(*h, *again) || again->length != text.size())
    hopwise::fuzz::broken("the header as save_checkpoint writes it reads back differently", head + "\n---\n" + text);
  return 0;
}
