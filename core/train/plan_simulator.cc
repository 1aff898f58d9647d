#include "core/train/plan_simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/train/plan_rules.h"
#include "core/util/errors.h"

namespace loom::core {
namespace {

double cost_of(PipelineOp op, const PassCosts& c) {
  switch (op) {
    case PipelineOp::kForward:
      return c.forward;
    case PipelineOp::kBackward:
      return c.backward;
    case PipelineOp::kBackwardInput:
      return c.backward_input;
    case PipelineOp::kBackwardWeight:
      return c.backward_weight;
    default:
      return 0;
  }
}

// A transfer: (gradient?, micro-batch, the virtual stage that sends it).
using Transfer = std::tuple<bool, int32_t, int32_t>;

}  // namespace

double Simulation::bubble() const {
  if (busy.empty() || span <= 0) return 0;
  double total = 0;
  for (double b : busy) total += b;
  return 1.0 - total / (static_cast<double>(busy.size()) * span);
}

Simulation simulate_plans(const std::vector<std::vector<PipelineAction>>& plans,
                          int32_t micro_batches, int32_t chunks, const PassCosts& costs,
                          const std::string& schedule) {
  const int32_t stages = static_cast<int32_t>(plans.size());
  if (stages < 1) throw InvalidArgument("plan simulator: no ranks");
  for (int32_t r = 0; r < stages; ++r) {
    try {
      check_plan(plans[static_cast<size_t>(r)], micro_batches, chunk_places(stages, r, chunks),
                 schedule);
    } catch (const Error& e) {
      throw InvalidArgument(fmt::format("rank {} of {}: {}", r, stages, e.what()));
    }
  }
  // Every transfer's sender and receiver, by (kind, micro-batch, sending virtual stage).
  std::map<Transfer, int32_t> sends, recvs;  // -> rank
  auto describe = [&](int32_t r, size_t i) {
    const PipelineAction& a = plans[static_cast<size_t>(r)][i];
    return fmt::format("pipeline schedule '{}': rank {} action {} ({} of micro-batch {}, chunk {})",
                       schedule, r, i, pipeline_op_name(a.op), a.micro_batch, a.chunk);
  };
  auto key_of = [&](int32_t r, const PipelineAction& a) {
    const int32_t vs = a.chunk * stages + r;
    switch (a.op) {
      case PipelineOp::kSendActivation:
        return Transfer{false, a.micro_batch, vs};
      case PipelineOp::kRecvActivation:
        return Transfer{false, a.micro_batch, vs - 1};
      case PipelineOp::kSendGrad:
        return Transfer{true, a.micro_batch, vs};
      default:  // kRecvGrad
        return Transfer{true, a.micro_batch, vs + 1};
    }
  };
  // The rank that must receive a transfer sent from virtual stage `vs`.
  auto receiver = [&](const Transfer& t) {
    const int32_t to = std::get<0>(t) ? std::get<2>(t) - 1 : std::get<2>(t) + 1;
    return ((to % stages) + stages) % stages;
  };
  auto sender = [&](const Transfer& t) { return std::get<2>(t) % stages; };
  for (int32_t r = 0; r < stages; ++r) {
    const auto& plan = plans[static_cast<size_t>(r)];
    for (size_t i = 0; i < plan.size(); ++i) {
      const PipelineAction& a = plan[i];
      if (is_pipeline_pass(a.op)) continue;
      const Transfer t = key_of(r, a);
      const bool send = is_pipeline_send(a.op);
      (send ? sends : recvs)[t] = r;
    }
  }
  for (const auto& [t, r] : sends)
    if (!recvs.count(t))
      throw InvalidArgument(fmt::format(
          "pipeline schedule '{}': rank {} sends the {} of micro-batch {} (virtual stage {}) "
          "but rank {} never receives it",
          schedule, r, std::get<0>(t) ? "gradient" : "activation", std::get<1>(t),
          std::get<2>(t), receiver(t)));
  for (const auto& [t, r] : recvs)
    if (!sends.count(t) || sender(t) != (std::get<0>(t) ? (r + 1) % stages : (r + stages - 1) % stages))
      throw InvalidArgument(fmt::format(
          "pipeline schedule '{}': rank {} receives the {} of micro-batch {} from virtual stage "
          "{}, which never sends it",
          schedule, r, std::get<0>(t) ? "gradient" : "activation", std::get<1>(t),
          std::get<2>(t)));

  Simulation sim;
  sim.busy.assign(static_cast<size_t>(stages), 0);
  sim.peak_in_flight.assign(static_cast<size_t>(stages), 0);
  std::vector<double> clock(static_cast<size_t>(stages), 0);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<int32_t> in_flight(static_cast<size_t>(stages), 0);
  std::map<Transfer, double> posted;  // when each send was posted (plus the transfer time)
  size_t left = 0;
  for (const auto& p : plans) left += p.size();
  while (left > 0) {
    bool moved = false;
    for (int32_t r = 0; r < stages; ++r) {
      const auto& plan = plans[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      double& now = clock[static_cast<size_t>(r)];
      while (i < plan.size()) {
        const PipelineAction& a = plan[i];
        TimedAction timed{r, a, now, now};
        if (is_pipeline_receive(a.op)) {
          auto it = posted.find(key_of(r, a));
          if (it == posted.end()) break;  // waits for its send
          now = std::max(now, it->second);
        } else if (is_pipeline_send(a.op)) {
          posted[key_of(r, a)] = now + costs.transfer;
        } else {
          const double c = cost_of(a.op, costs);
          now += c;
          sim.busy[static_cast<size_t>(r)] += c;
          int32_t& f = in_flight[static_cast<size_t>(r)];
          if (a.op == PipelineOp::kForward) {
            sim.peak_in_flight[static_cast<size_t>(r)] =
                std::max(sim.peak_in_flight[static_cast<size_t>(r)], ++f);
          } else if (a.op == PipelineOp::kBackward || a.op == PipelineOp::kBackwardWeight) {
            --f;
          }
        }
        timed.end = now;
        sim.timeline.push_back(timed);
        ++i;
        --left;
        moved = true;
      }
    }
    if (!moved) {
      std::string stuck;
      for (int32_t r = 0; r < stages; ++r)
        if (next[static_cast<size_t>(r)] < plans[static_cast<size_t>(r)].size())
          stuck += "\n  " + describe(r, next[static_cast<size_t>(r)]) + " waits";
      throw InvalidArgument(
          fmt::format("pipeline schedule '{}': the ranks' plans deadlock:{}", schedule, stuck));
    }
  }
  for (double t : clock) sim.span = std::max(sim.span, t);
  return sim;
}

double theoretical_bubble(const std::string& schedule, int32_t stages, int32_t micro_batches,
                          int32_t chunks) {
  const double p = stages - 1, m = micro_batches, v = chunks;
  if (schedule == "gpipe" || schedule == "1f1b") return p / (m + p);
  if (schedule == "interleaved") return p / (v * m + p);
  if (schedule == "zb_h1") return p / (3 * m + p);
  return -1;
}

std::string draw_timeline(const Simulation& sim, int32_t stages, double unit) {
  // Cells of one time unit: a pass's first cell holds its letter and micro-batch (and the
  // chunk as a letter a, b, ... when a rank holds several), the rest '-'; idle cells '.'.
  int32_t chunks = 1;
  for (const TimedAction& t : sim.timeline) chunks = std::max(chunks, t.action.chunk + 1);
  const size_t cells = static_cast<size_t>(std::ceil(sim.span / unit - 1e-9));
  std::vector<std::vector<std::string>> grid(static_cast<size_t>(stages),
                                             std::vector<std::string>(cells, "."));
  size_t width = 1;
  for (const TimedAction& t : sim.timeline) {
    if (!is_pipeline_pass(t.action.op)) continue;
    const char* letters = "FBbW";
    char letter = t.action.op == PipelineOp::kForward          ? letters[0]
                  : t.action.op == PipelineOp::kBackward       ? letters[1]
                  : t.action.op == PipelineOp::kBackwardInput  ? letters[2]
                                                               : letters[3];
    std::string label = fmt::format("{}{}", letter, t.action.micro_batch);
    if (chunks > 1) label += static_cast<char>('a' + t.action.chunk % 26);
    width = std::max(width, label.size());
    const size_t begin = static_cast<size_t>(std::llround(t.start / unit));
    const size_t end = static_cast<size_t>(std::llround(t.end / unit));
    auto& row = grid[static_cast<size_t>(t.rank)];
    for (size_t c = begin; c < end && c < cells; ++c) row[c] = c == begin ? label : "-";
  }
  std::string out;
  for (int32_t r = 0; r < stages; ++r) {
    out += fmt::format("rank {:>2} |", r);
    for (const std::string& cell : grid[static_cast<size_t>(r)])
      out += fmt::format(" {:<{}}", cell, width);
    out += "\n";
  }
  return out;
}

}  // namespace loom::core
