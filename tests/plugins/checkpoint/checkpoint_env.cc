#include "tests/plugins/checkpoint/checkpoint_env.h"

#include <loom/cpp/half.h>

#include <cstdlib>
#include <cstring>

#include "loom/kinds.h"

namespace loom::testing {
namespace fs = std::filesystem;

CheckpointEnv::CheckpointEnv() {
  std::vector<core::SearchRoot> roots{{fs::absolute("plugins/checkpoint"), "test"}};
  plugins_ = std::make_unique<core::PluginManager>(core::Catalog(roots));
  plugins_->load("checkpoint");
}

Format CheckpointEnv::format(const nlohmann::json& node) {
  Format f;
  f.object = core::build_component(*plugins_, node, kinds::kCheckpointFormat, "/checkpoint/format");
  f.api = interface_cast<ICheckpointFormat>(f.object.get());
  if (f.api == nullptr) throw std::runtime_error("not a checkpoint_format");
  return f;
}

CheckpointTensor OwnedTensor::view() {
  CheckpointTensor t{};
  t.struct_size = sizeof(CheckpointTensor);
  t.name = name.c_str();
  t.ndim = static_cast<int32_t>(global_shape.size());
  for (int32_t d = 0; d < t.ndim; ++d) {
    t.global_shape[d] = global_shape[d];
    t.offset[d] = offset[d];
  }
  t.data = make_view(bytes.data(), dtype, shape.data(), t.ndim);
  return t;
}

std::vector<float> OwnedTensor::floats() const {
  size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], &bytes[4 * i], 4);
      continue;
    }
    std::memcpy(&h, &bytes[2 * i], 2);
    out[i] = dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  return out;
}

OwnedTensor random_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          std::mt19937& rng) {
  OwnedTensor t = request(name, dtype, shape, std::vector<int64_t>(shape.size(), 0), shape);
  std::normal_distribution<float> normal;
  size_t n = t.bytes.size() / dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    float f = normal(rng);
    uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
    if (dtype == DType::kF32)
      std::memcpy(&t.bytes[4 * i], &f, 4);
    else if (dtype == DType::kBF16 || dtype == DType::kF16)
      std::memcpy(&t.bytes[2 * i], &h, 2);
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    for (auto& b : t.bytes) b = static_cast<unsigned char>(rng());
  return t;
}

OwnedTensor request(const std::string& name, DType dtype, std::vector<int64_t> global_shape,
                    std::vector<int64_t> offset, std::vector<int64_t> shape) {
  OwnedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.global_shape = std::move(global_shape);
  t.offset = std::move(offset);
  t.shape = std::move(shape);
  size_t n = dtype_size(dtype);
  for (int64_t e : t.shape) n *= static_cast<size_t>(e);
  t.bytes.assign(n, 0);
  return t;
}

OwnedTensor slice_of(const OwnedTensor& whole, std::vector<int64_t> offset,
                     std::vector<int64_t> shape) {
  OwnedTensor out = request(whole.name, whole.dtype, whole.global_shape, offset, shape);
  const size_t elem = dtype_size(whole.dtype);
  const size_t ndim = shape.size();
  std::vector<int64_t> index(ndim, 0);
  for (size_t flat = 0; flat < out.bytes.size() / elem; ++flat) {
    size_t rest = flat, src = 0, stride = 1;
    for (size_t d = ndim; d-- > 0;) {
      index[d] = static_cast<int64_t>(rest % shape[d]);
      rest /= shape[d];
    }
    for (size_t d = ndim; d-- > 0;) {
      src += static_cast<size_t>(offset[d] + index[d]) * stride;
      stride *= whole.global_shape[d];
    }
    std::memcpy(&out.bytes[flat * elem], &whole.bytes[src * elem], elem);
  }
  return out;
}

Outcome outcome(Status status) {
  Outcome o{status.code, status.message != nullptr ? status.message : ""};
  status_release(&status);
  return o;
}

Outcome save(Format& format, const fs::path& dir, std::vector<OwnedTensor>& tensors,
             const nlohmann::json& metadata, int32_t rank, int32_t world) {
  std::vector<CheckpointTensor> views;
  for (OwnedTensor& t : tensors) views.push_back(t.view());
  std::string d = dir.string(), m = metadata.dump();
  return outcome(format->save({d.data(), d.size()}, views.data(),
                              static_cast<int64_t>(views.size()), {m.data(), m.size()}, rank,
                              world));
}

Outcome load(Format& format, const fs::path& dir, std::vector<OwnedTensor>& requests) {
  std::vector<CheckpointTensor> views;
  for (OwnedTensor& t : requests) views.push_back(t.view());
  std::string d = dir.string();
  return outcome(
      format->load({d.data(), d.size()}, views.data(), static_cast<int64_t>(views.size())));
}

Outcome metadata(Format& format, const fs::path& dir, nlohmann::json* out) {
  std::string d = dir.string();
  StringView text{};
  Outcome o = outcome(format->metadata({d.data(), d.size()}, &text));
  if (o.code == Code::kOk) *out = nlohmann::json::parse(text.data, text.data + text.size);
  return o;
}

fs::path fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

nlohmann::json metadata_for(const std::vector<OwnedTensor>& tensors, const nlohmann::json& spec) {
  nlohmann::json listed = nlohmann::json::object();
  for (const OwnedTensor& t : tensors)
    listed[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.global_shape}};
  return {{"format_version", 1}, {"iteration", 7},           {"spec", spec},
          {"tensors", listed},   {"trainer", {{"seed", 1}}}, {"loom_version", "test"}};
}

}  // namespace loom::testing
