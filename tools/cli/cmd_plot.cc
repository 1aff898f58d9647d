// loom plot RUN_DIR [--out FILE.png]
//
// Draws a run's metrics.jsonl (loss and validation loss, learning rate, grad norm, tokens/s,
// and the measured pipeline bubble when the run had one) over steps into a PNG, with
// matplotlib (Debian's python3-matplotlib, which tools/setup installs) run by Debian's
// /usr/bin/python3. The drawing script is part of this binary and is handed to Python on
// its standard input, so the command works from any directory.
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "core/util/errors.h"
#include "tools/cli/commands.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPlotUsage = "loom plot RUN_DIR [--out FILE.png]";

// argv[1]: metrics.jsonl, argv[2]: the PNG, argv[3]: the title.
constexpr const char* kScript = R"PY(
import json, sys

def fail(code, message):  # loom's exit codes: 5 a file, 7 not available here
    print("loom plot: error: " + message, file=sys.stderr)
    sys.exit(code)

try:
    import matplotlib
except ImportError:
    fail(7, "matplotlib is missing for /usr/bin/python3; install it with "
            "`apt-get install python3-matplotlib` (tools/setup does)")
matplotlib.use("Agg")
import matplotlib.pyplot as plt

metrics, out, title = sys.argv[1], sys.argv[2], sys.argv[3]
train, valid = {}, ([], [])
with open(metrics) as f:
    for number, line in enumerate(f, 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            fail(5, f"{metrics}:{number} is not JSON; the file is damaged")
        step = rec.get("step")
        if step is None:
            continue
        if "valid_loss" in rec:
            valid[0].append(step)
            valid[1].append(rec["valid_loss"])
            continue
        for key, value in rec.items():
            if key != "step" and isinstance(value, (int, float)):
                train.setdefault(key, ([], []))
                train[key][0].append(step)
                train[key][1].append(value)
if "loss" not in train:
    fail(5, f"{metrics} holds no training step yet")

panels = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "grad norm"),
          ("tokens_per_s", "tokens/s")]
if "pipeline_bubble" in train:
    panels.append(("pipeline_bubble", "pipeline bubble (measured)"))
cols = 3 if len(panels) > 4 else 2
rows = (len(panels) + cols - 1) // cols
fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
for ax, (key, label) in zip(axes.flat, panels):
    if key in train:
        ax.plot(*train[key], label="train" if key == "loss" else None)
    if key == "loss" and valid[0]:
        ax.plot(*valid, "o-", label="validation")
        ax.legend()
    ax.set_title(label)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
fig.suptitle(title)
fig.tight_layout()
fig.savefig(out, dpi=100)
print(f"loom plot: {out}")
)PY";

}  // namespace

int cmd_plot(const std::vector<std::string>& argv) {
  Args args = parse_args(argv, {{}, {"--out"}, 1, 1, kPlotUsage});
  const fs::path run_dir = args.positionals[0];
  const fs::path metrics = run_dir / "metrics.jsonl";
  if (!fs::exists(metrics))
    throw core::IoError(fmt::format("{} does not exist: give the run directory of `loom train` "
                                    "(its --run-dir, or runs/<spec name>)",
                                    metrics.string()));
  const fs::path out = args.get("--out", (run_dir / "metrics.png").string());
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const std::string command = "/usr/bin/python3 - " + quote(metrics.string()) + " " +
                              quote(out.string()) + " " + quote(run_dir.string());
  FILE* python = popen(command.c_str(), "w");
  if (python == nullptr)
    throw core::IoError("cannot start /usr/bin/python3 for the plot; install python3 (tools/setup)");
  std::fputs(kScript, python);
  const int status = pclose(python);
  if (status == -1 || !WIFEXITED(status))
    throw core::IoError("/usr/bin/python3 did not finish drawing the plot");
  const int code = WEXITSTATUS(status);  // the script said why on stderr
  if (code == core::kExitOk || code == core::kExitIo || code == core::kExitUnavailable) return code;
  return core::kExitInternal;
}

}  // namespace loom::cli
