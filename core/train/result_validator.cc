#include "core/train/result_validator.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace loom::core {

std::string ResultValidator::reject(double loss, double grad_norm) {
  if (!enabled_) return "";
  if (!std::isfinite(loss)) return "non-finite loss";
  if (!overflow_normal_ && !std::isfinite(grad_norm)) return "non-finite gradients";
  if (!check_spiky_ || !std::isfinite(grad_norm)) return "";
  double value = std::fabs(loss);
  if (seen_ < samples_) {
    ++seen_;
    largest_ = std::max(largest_, value);
    return "";
  }
  if (value >= factor_ * largest_)
    return fmt::format("spiky loss {:.6g} >= {:g} x {:.6g}, the largest of the first {} steps",
                       loss, factor_, largest_, samples_);
  return "";
}

std::string ResultValidator::combine(const std::vector<std::string>& reasons) {
  bool all_same = !reasons.empty();
  for (const std::string& r : reasons) all_same = all_same && r == reasons.front();
  if (all_same) return reasons.front();
  std::string out;
  size_t listed = 0, more = 0;
  for (size_t rank = 0; rank < reasons.size(); ++rank) {
    if (reasons[rank].empty()) continue;
    if (listed == 4) {
      ++more;
      continue;
    }
    out += fmt::format("{}rank {}: {}", listed == 0 ? "" : "; ", rank, reasons[rank]);
    ++listed;
  }
  if (more > 0) out += fmt::format("; and {} more rank{}", more, more == 1 ? "" : "s");
  return out;
}

bool ResultValidator::reproduced(double first, double rerun) {
  if (std::isnan(first) && std::isnan(rerun)) return true;
  return std::memcmp(&first, &rerun, sizeof(double)) == 0;
}

}  // namespace loom::core
