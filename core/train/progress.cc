#include "core/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/util/errors.h"
#include "core/util/log.h"

namespace loom::core {

Progress::Progress(const std::filesystem::path& run_dir, int64_t steps, int64_t first_iteration)
    : tty_(isatty(fileno(stdout)) != 0),
      steps_(steps),
      first_iteration_(first_iteration),
      start_(std::chrono::steady_clock::now()) {
  if (run_dir.empty()) return;
  std::filesystem::create_directories(run_dir);
  metrics_.open(run_dir / "metrics.jsonl", std::ios::app);
  if (!metrics_)
    throw IoError(fmt::format("cannot write {}", (run_dir / "metrics.jsonl").string()));
  tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir);
}

Progress::~Progress() = default;

void Progress::clear_bar() {
  if (tty_) std::printf("\r\033[K");
}

void Progress::add(const StepResult& r) {
  if (!r.rerun_reason.empty()) {
    clear_bar();
    std::string verdict =
        r.rerun_reproduced
            ? "reproduced exactly: the data or the model, not a transient fault"
            : fmt::format("not reproduced (the rerun gave loss {:.6g}, grad norm {:.6g}): a "
                          "transient fault of the machine; the step goes on with the rerun",
                          r.loss, r.grad_norm);
    std::printf("step %lld run again (%s; loss %.6g, grad norm %.6g): %s\n",
                static_cast<long long>(r.step), r.rerun_reason.c_str(), r.first_loss,
                r.first_grad_norm, verdict.c_str());
    if (metrics_.is_open()) {
      auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
      metrics_ << nlohmann::json{{"step", r.step},
                                 {"rerun", r.rerun_reproduced ? "reproducible" : "transient"},
                                 {"reason", r.rerun_reason},
                                 {"first_loss", number(r.first_loss)},
                                 {"first_grad_norm", number(r.first_grad_norm)},
                                 {"rerun_loss", number(r.loss)},
                                 {"rerun_grad_norm", number(r.grad_norm)}}
                          .dump()
               << "\n"
               << std::flush;
    }
  }
  if (r.skipped) {
    ++skipped_;
    clear_bar();
    std::printf("step %lld skipped: non-finite %s (loss scale %g)\n",
                static_cast<long long>(r.step), std::isfinite(r.loss) ? "gradients" : "loss",
                r.loss_scale);
  } else {
    loss_ += r.loss;
    norm_ += r.grad_norm;
    ++count_;
  }
  time_ += r.seconds;
  tokens_ += r.tokens;
  lr_ = r.lr;
  ++steps_in_;
}

void Progress::log(int64_t iteration, const LogFigures& figures) {
  double step_ms = 1e3 * time_ / static_cast<double>(steps_in_);
  double tps = static_cast<double>(tokens_) / time_;
  double mfu = figures.peak_flops > 0 ? figures.flops_per_step * static_cast<double>(steps_in_) /
                                            time_ / figures.peak_flops
                                      : 0;
  double loss = count_ ? loss_ / static_cast<double>(count_) : std::nan("");
  double norm = count_ ? norm_ / static_cast<double>(count_) : std::nan("");
  std::string extra;
  if (figures.loss_scale) extra += fmt::format(" | scale {:g}", *figures.loss_scale);
  for (const auto& [name, value] : figures.metrics)
    extra += fmt::format(" | {} {:.4g}", name, value);
  // Stragglers: in a synchronous step every rank's wall time is the slowest's, so the
  // ranks compare their compute time (the rest they spent waiting for the slowest).
  const std::vector<double>& compute = figures.rank_compute_seconds;
  size_t slowest = 0, fastest = 0;
  for (size_t i = 0; i < compute.size(); ++i) {
    if (compute[i] > compute[slowest]) slowest = i;
    if (compute[i] < compute[fastest]) fastest = i;
  }
  clear_bar();
  std::printf(
      "iter %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.1f ms/step "
      "| MFU %.1f%% | mem %s (rss %s)%s\n",
      static_cast<long long>(iteration), static_cast<long long>(steps_), loss, lr_, norm, tps,
      step_ms, 100 * mfu, human_bytes(static_cast<double>(figures.peak_memory)).c_str(),
      human_bytes(static_cast<double>(figures.max_rss)).c_str(), extra.c_str());
  if (compute.size() > 1 && compute[slowest] >= figures.straggler_factor * compute[fastest])
    std::printf("straggler: rank %zu computes %.1f ms per step, %.1fx rank %zu's %.1f ms (the "
                "other ranks wait for it in collectives; /log/straggler_factor %g)\n",
                slowest, 1e3 * compute[slowest],
                compute[fastest] > 0 ? compute[slowest] / compute[fastest] : 0.0, fastest,
                1e3 * compute[fastest], figures.straggler_factor);
  if (metrics_.is_open()) {
    nlohmann::json line = {{"step", iteration},
                           {"loss", loss},
                           {"lr", lr_},
                           {"grad_norm", norm},
                           {"tokens_per_s", tps},
                           {"step_ms", step_ms},
                           {"mfu", mfu},
                           {"peak_mem_bytes", figures.peak_memory},
                           {"max_rss_bytes", figures.max_rss},
                           {"skipped", skipped_},
                           {"loss_scale", figures.loss_scale.value_or(1.0)}};
    if (compute.size() > 1) {
      line["compute_ms_fastest"] = 1e3 * compute[fastest];
      line["compute_ms_slowest"] = 1e3 * compute[slowest];
      line["slowest_rank"] = slowest;
    }
    if (!std::isfinite(loss)) line["loss"] = nullptr;
    if (!std::isfinite(norm)) line["grad_norm"] = nullptr;
    for (const auto& [name, value] : figures.metrics)
      line[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
    metrics_ << line.dump() << "\n" << std::flush;
    // The same numbers for TensorBoard, under the names of Megatron's writer where it has one.
    std::vector<std::pair<std::string, double>> scalars = {
        {"lm loss", loss},          {"learning-rate", lr_},      {"grad-norm", norm},
        {"throughput/tokens_per_s", tps}, {"throughput/step_ms", step_ms},
        {"throughput/mfu", mfu},    {"memory/peak_bytes", static_cast<double>(figures.peak_memory)}};
    if (figures.loss_scale) scalars.emplace_back("loss-scale", *figures.loss_scale);
    for (const auto& [name, value] : figures.metrics) scalars.emplace_back(name, value);
    std::erase_if(scalars, [](const auto& s) { return !std::isfinite(s.second); });
    if (tensorboard_) tensorboard_->scalars(iteration, scalars);
  }
  loss_ = time_ = norm_ = 0;
  count_ = tokens_ = skipped_ = steps_in_ = 0;
}

void Progress::validation(int64_t iteration, double loss) {
  if (!std::isfinite(loss)) return;
  clear_bar();
  std::printf("validation at iter %lld | loss %.4f | ppl %.2f\n", static_cast<long long>(iteration),
              loss, std::exp(loss));
  if (metrics_.is_open()) {
    metrics_ << nlohmann::json{{"step", iteration}, {"valid_loss", loss}}.dump() << "\n"
             << std::flush;
    if (tensorboard_) tensorboard_->scalars(iteration, {{"lm loss validation", loss}});
  }
}

void Progress::bar(int64_t iteration) {
  if (!tty_ || iteration >= steps_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = elapsed / static_cast<double>(iteration - first_iteration_) *
               static_cast<double>(steps_ - iteration);
  int width = 30, filled = static_cast<int>(width * iteration / steps_);
  std::printf("\r[%s%s] %lld/%lld  eta %.0fs", std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), static_cast<long long>(iteration),
              static_cast<long long>(steps_), eta);
}

}  // namespace loom::core
