#include "gossip_exchange.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm::detail {

GossipExchange::GossipExchange(Communicator& comm, const AveragingSpec& spec, float* params, std::size_t count)
    : comm_(comm), transport_(comm.transport()), params_(params), count_(count) {
  n_ = comm.size();
  const auto& ring = comm.ring_order();
  position_ = static_cast<int>(std::find(ring.begin(), ring.end(), comm.rank()) - ring.begin());
  per_step_ = std::min(spec.peers, std::max(1, n_ - 1));
  first_tag_ = reserved_tags("gossip").first;  // spec.peers fits the range (AveragingSpec::parse)
  if (spec.peers > per_step_ && n_ > 1 && comm.rank() == 0)
    log::warn("gossip:peers={} on {} ranks: each rank has {} partner(s) at most, so {} per step", spec.peers, n_,
              n_ - 1, per_step_);
  slots_.resize(static_cast<std::size_t>(per_step_));
  if (spec.codec != "none") {
    codec_ = compression::make_codec(spec.codec);
    // One payload decoded alone (no sum of payloads): a world of one for the codec's headroom.
    state_ = compression::CodecState(0x676f73ull + static_cast<std::uint64_t>(comm.rank()), 0, 1);
    scale_count_ = codec_->scale_count(count);
    message_bytes_ = scale_count_ * sizeof(float) + codec_->payload_bytes(count);
    diff_.assign(count, 0.0f);
    own_decoded_.assign(count, 0.0f);
    peer_decoded_.assign(count, 0.0f);
    out_.resize(message_bytes_);
    set_reference();
  } else {
    message_bytes_ = count * sizeof(float);
  }
  for (Slot& s : slots_) s.in.resize(message_bytes_);
}

GossipExchange::~GossipExchange() {
  for (Request& r : requests_)
    if (r.active) transport_.cancel(r);
}

void GossipExchange::set_reference() {
  if (codec_) reference_.assign(params_, params_ + count_);
}

int GossipExchange::partners() const {
  int m = 0;
  for (const Slot& s : slots_) m += s.rank >= 0;
  return m;
}

void GossipExchange::start(std::int64_t step) {
  if (in_flight_) throw Error("internal: a gossip exchange started while another is in flight");
  step_ = step;
  const auto& ring = comm_.ring_order();
  for (int j = 0; j < per_step_; ++j) {
    const int q = gossip_partner(position_, n_, step * per_step_ + j);
    slots_[static_cast<std::size_t>(j)].rank = q < 0 ? -1 : ring[static_cast<std::size_t>(q)];
  }
  if (partners() == 0) return;
  const std::byte* message = reinterpret_cast<const std::byte*>(params_);
  if (codec_) {
    for (std::size_t i = 0; i < count_; ++i) diff_[i] = params_[i] - reference_[i];
    float* scales = reinterpret_cast<float*>(out_.data());
    std::byte* payload = out_.data() + scale_count_ * sizeof(float);
    if (scale_count_ > 0) codec_->local_scales(diff_.data(), count_, scales, state_);
    codec_->encode(diff_.data(), count_, payload, state_, scale_count_ ? scales : nullptr);
    codec_->decode(payload, count_, own_decoded_.data(), state_, scale_count_ ? scales : nullptr);
    message = out_.data();
  }
  requests_.clear();
  for (int j = 0; j < per_step_; ++j) {
    Slot& s = slots_[static_cast<std::size_t>(j)];
    if (s.rank < 0) continue;
    requests_.push_back(transport_.irecv(s.in.data(), message_bytes_, s.rank, first_tag_ + j));
    requests_.push_back(transport_.isend(message, message_bytes_, s.rank, first_tag_ + j));
  }
  in_flight_ = true;
}

void GossipExchange::wait_all(const char* what) {
  try {
    transport_.wait_all(requests_);
  } catch (const std::exception& e) {
    for (Request& r : requests_)
      if (r.active) transport_.cancel(r);
    in_flight_ = false;
    if (!dynamic_cast<const InvalidArgument*>(&e)) transport_.abandon();
    std::string with;
    for (const Slot& s : slots_)
      if (s.rank >= 0) with += fmt::format("{}{}", with.empty() ? "" : ", ", s.rank);
    const std::string text =
        fmt::format("hopwise: rank {}: gossip {} of step {} with rank(s) {} ({} bytes each) failed: {}", comm_.rank(),
                    what, step_ + 1, with, message_bytes_, e.what());
    if (auto* te = dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(text, te->pending_ranks());
    throw Error(text);
  }
  in_flight_ = false;
}

void GossipExchange::drop() {
  if (in_flight_) wait_all("exchange");
}

void GossipExchange::finish_and_mix() {
  if (!in_flight_) return;
  wait_all("exchange");
  const int m = partners();
  const float w = 1.0f / static_cast<float>(per_step_ + 1);
  if (!codec_) {
    if (m == 1 && per_step_ == 1) {
      // (x + y) / 2, the same bits on both partners: the pair leaves with one model.
      const float* y = nullptr;
      for (const Slot& s : slots_)
        if (s.rank >= 0) y = reinterpret_cast<const float*>(s.in.data());
      for (std::size_t i = 0; i < count_; ++i) params_[i] = 0.5f * (params_[i] + y[i]);
      return;
    }
    const float self = static_cast<float>(per_step_ + 1 - m);
    std::vector<const float*> ys;
    for (const Slot& s : slots_)
      if (s.rank >= 0) ys.push_back(reinterpret_cast<const float*>(s.in.data()));
    for (std::size_t i = 0; i < count_; ++i) {
      float acc = self * params_[i];
      for (const float* y : ys) acc += y[i];
      params_[i] = w * acc;
    }
    return;
  }
  for (const Slot& s : slots_) {
    if (s.rank < 0) continue;
    const float* scales = reinterpret_cast<const float*>(s.in.data());
    const std::byte* payload = s.in.data() + scale_count_ * sizeof(float);
    codec_->decode(payload, count_, peer_decoded_.data(), state_, scale_count_ ? scales : nullptr);
    for (std::size_t i = 0; i < count_; ++i) params_[i] += w * (peer_decoded_[i] - own_decoded_[i]);
  }
}

}  // namespace hopwise::comm::detail
