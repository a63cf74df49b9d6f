// libFuzzer target: the TCP store's server (store_server::Core), as a hostile network would drive it. The input is a
// script of steps for up to four connections: open, bytes as they come (unframed), a request frame built around the
// bytes (framed, so that the fuzzer reaches the table past the introduction), drain the replies, close, or let time
// pass. After every step: no exception escaped, every reply is a whole frame with status 0 or 1, a connection is
// read from only while its unsent replies are under the cap, and one that never introduced itself got nothing but
// refusals (or the answer to its introduction).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "../../comm/src/stores/store_server.h"

namespace {

namespace ss = hopwise::comm::store_server;
namespace sp = hopwise::comm::store_protocol;

void fail(const char* what) {
  std::fprintf(stderr, "store server: %s\n", what);
  std::abort();
}

struct Reader {  // what a client has received, taken apart into replies
  std::string bytes;
  int replies = 0, refusals = 0;
  void take(std::string_view more) {
    bytes.append(more);
    while (bytes.size() >= 4) {
      std::uint32_t n = 0;
      std::memcpy(&n, bytes.data(), 4);
      if (n < 5) fail("a reply shorter than its id and status");
      if (bytes.size() < 4 + std::size_t{n}) return;
      const auto status = static_cast<unsigned char>(bytes[8]);
      if (status > 1) fail("a reply with a status other than 0 or 1");
      ++replies;
      refusals += status;
      bytes.erase(0, 4 + std::size_t{n});
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ss::Limits limits;
  limits.hello_bytes = 1024;
  limits.pending_output = 4096;
  limits.hello_timeout = std::chrono::seconds(5);
  ss::Core core("job", size > 0 && (data[0] & 1) ? "token" : "", limits);
  auto now = ss::Clock::time_point{};
  std::map<int, Reader> readers;
  std::size_t at = 1;
  auto next = [&](std::size_t n) {
    std::string s(reinterpret_cast<const char*>(data) + at, std::min(n, size - at));
    at += s.size();
    return s;
  };
  while (at + 2 <= size) {
    const int client = data[at] & 3, step = (data[at] >> 2) % 7;
    const std::size_t len = data[at + 1];
    at += 2;
    const bool open = readers.count(client) > 0;
    switch (step) {
      case 0:  // connect
        if (!open) {
          core.open(client, "fuzz", now);
          readers[client];
        }
        break;
      case 1:  // raw bytes
        if (open && core.wants_input(client)) {
          const std::string b = next(len);
          core.receive(client, b.data(), b.size());
        }
        break;
      case 2: {  // a request frame around the bytes: op from the first byte, the rest split into a key and a value
        if (!open || !core.wants_input(client)) break;
        const std::string b = next(len);
        sp::Request r;
        r.op = b.empty() ? sp::kHello : 1 + static_cast<std::uint8_t>(b[0]) % 6;
        r.id = static_cast<std::int32_t>(len);
        r.delta = b.size() > 1 ? static_cast<std::int8_t>(b[1]) * (std::int64_t{1} << 56) : 1;
        const std::string rest = b.size() > 2 ? b.substr(2) : std::string();
        if (r.op == sp::kHello) {
          r.value = "job";
          if (!rest.empty()) r.keys.push_back(rest == "t" ? "token" : rest);
        } else {
          r.keys.push_back(rest.substr(0, rest.size() / 2));
          if (r.op == sp::kWait || r.op == sp::kCheck) r.keys.push_back(rest.substr(rest.size() / 2));
          r.value = rest.substr(rest.size() / 2);
        }
        std::string frame = sp::pack(r);
        const auto n = static_cast<std::uint32_t>(frame.size());
        frame.insert(0, reinterpret_cast<const char*>(&n), 4);
        core.receive(client, frame.data(), frame.size());
        break;
      }
      case 3:  // the client reads what it is owed
        if (open)
          for (std::string_view p = core.pending(client); !p.empty(); p = core.pending(client)) {
            readers[client].take(p);
            core.sent(client, p.size());
          }
        break;
      case 4:  // it reads a little
        if (open) {
          const std::string_view p = core.pending(client).substr(0, len);
          readers[client].take(p);
          core.sent(client, p.size());
        }
        break;
      case 5:  // its socket goes
        if (open) {
          core.close(client);
          readers.erase(client);
        }
        break;
      default:  // time passes
        now += std::chrono::seconds(len % 8);
        for (int gone : core.expire(now)) {
          readers.erase(gone);
        }
        break;
    }
    for (auto& [id, r] : readers) {
      if (core.wants_input(id) && core.unsent(id) >= limits.pending_output) fail("reading past the cap on replies");
      if (!core.introduced(id) && r.replies > r.refusals) fail("a stranger got an answer");
    }
  }
  return 0;
}
