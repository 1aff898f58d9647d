// import_hf and hf_metadata: a Hugging Face model directory read back by loom names.
#include <vector>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/hf_directory.h"
#include "plugins/checkpoint/hf_io.h"
#include "plugins/checkpoint/hf_layout.h"
#include "plugins/checkpoint/requests.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The Hugging Face tensor of block `b`, checked against the shape config.json implies.
HfDirectory::Found source(const HfDirectory& dir, const HfLayout& layout, const RowBlock& b,
                          const std::string& loom) {
  HfDirectory::Found f = dir.find(b.hf, layout.base_prefix);
  if (f.file == nullptr)
    fail(Code::kNotFound, dir.dir().string() + ": tensor '" + b.hf + "' (loom's '" + loom +
                              "') is in none of " + dir.weight_files() +
                              "; the files do not match config.json");
  const std::vector<int64_t>& want = layout.hf_shapes.at(b.hf);
  if (f.tensor->shape != want)
    fail(Code::kInvalidArgument, f.file->path().string() + ": tensor '" + f.tensor->name +
                                     "' has shape " + shape_text(f.tensor->shape) + " but " +
                                     dir.config_path().string() + " implies " + shape_text(want));
  f.file->verify(*f.tensor, " (loom's '" + loom + "')");
  return f;
}

// Builds the whole loom tensor `t` (row-major, in the dtype of its first source) into `out`.
DType assemble(const HfDirectory& dir, const HfLayout& layout, const TensorLayout& t, DType wanted,
               std::vector<unsigned char>& out) {
  DType work = DType::kInvalid;
  std::vector<unsigned char> converted;
  int64_t n = 1;
  for (int64_t e : t.shape) n *= e;
  for (const RowBlock& b : t.blocks) {
    HfDirectory::Found f = source(dir, layout, b, "model." + t.loom);
    if (f.tensor->dtype == DType::kInvalid || !convertible(f.tensor->dtype, wanted))
      fail(Code::kUnimplemented, f.file->path().string() + ": tensor '" + f.tensor->name + "' is " +
                                     f.tensor->st_dtype + ", which loom cannot read as " +
                                     dtype_name(wanted) + " (f32, bf16 and f16 convert)");
    if (work == DType::kInvalid) {
      work = f.tensor->dtype;
      out.assign(static_cast<size_t>(n) * dtype_size(work), 0);
    }
    auto* bytes = const_cast<unsigned char*>(f.file->bytes(*f.tensor));
    if (f.tensor->dtype != work) {  // sources of one tensor in different dtypes
      int64_t m = static_cast<int64_t>(f.tensor->end - f.tensor->begin) /
                  static_cast<int64_t>(dtype_size(f.tensor->dtype));
      converted.resize(static_cast<size_t>(m) * dtype_size(work));
      convert(bytes, f.tensor->dtype, converted.data(), work, m);
      bytes = converted.data();
    }
    copy_block(b, t.shape, f.tensor->shape, dtype_size(work), out.data(), bytes, true);
  }
  return work;
}

}  // namespace

void import_hf(const fs::path& dir, CheckpointTensor* requests, int64_t count) {
  if (count < 0 || (count > 0 && requests == nullptr))
    fail(Code::kInvalidArgument, "safetensors load: no request array");
  HfDirectory hf(dir);
  HfModel model = hf_model_from_config(hf.config(), hf.config_path());
  HfLayout layout = hf_layout(model);
  std::vector<unsigned char> whole;
  for (int64_t i = 0; i < count; ++i) {
    CheckpointTensor& r = requests[i];
    Box want = checked_slice(r, "safetensors load");
    std::string name = r.name;
    if (name.rfind("optim.", 0) == 0)
      fail(Code::kNotFound, "tensor '" + name + "' is not in " + dir.string() +
                                ": a safetensors checkpoint holds model weights only (no "
                                "optimizer state); resume from a sharded checkpoint, or load "
                                "the weights alone and start the optimizer afresh");
    const TensorLayout* t = name.rfind("model.", 0) == 0 ? layout.find(name.substr(6)) : nullptr;
    if (t == nullptr)
      fail(Code::kNotFound, "tensor '" + name + "' has no counterpart in the " +
                                hf_architecture(model.family) + " of " + hf.config_path().string());
    if (std::vector<int64_t>(r.global_shape, r.global_shape + r.ndim) != t->shape)
      fail(Code::kInvalidArgument, "tensor '" + name + "' has the shape " + shape_text(t->shape) +
                                       " in " + dir.string() + " (per its config.json) but " +
                                       global_shape_text(r) + " was requested");
    DType work = assemble(hf, layout, *t, r.data.dtype, whole);
    int64_t zeros[kMaxDims] = {};
    copy_region(contiguous(whole.data(), work, zeros, t->shape.data(), r.ndim), strided_of(r),
                want);
  }
}

std::string hf_metadata(const fs::path& dir) {
  HfDirectory hf(dir);
  std::string stored = hf.metadata("loom");
  if (!stored.empty()) {
    json metadata = parse_json_input(stored, hf.weight_files() + " \"__metadata__\".\"loom\"",
                                     Code::kDataLoss, "export the checkpoint again");
    if (!metadata.is_object() || !metadata.contains("tensors"))
      fail(Code::kDataLoss, dir.string() +
                                ": the loom metadata in the safetensors header is "
                                "damaged; export the checkpoint again");
    return metadata.dump();
  }
  HfModel model = hf_model_from_config(hf.config(), hf.config_path());
  HfLayout layout = hf_layout(model);
  json tensors = json::object();
  for (const TensorLayout& t : layout.tensors) {
    HfDirectory::Found f = hf.find(t.blocks.front().hf, layout.base_prefix);
    DType dtype = f.file != nullptr ? f.tensor->dtype : DType::kF32;
    tensors["model." + t.loom] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}};
  }
  return json{{"format_version", 1},
              {"iteration", 0},
              {"spec", {{"model", loom_model_node(model)}}},
              {"tensors", tensors},
              {"format",
               {{"impl", "safetensors"},
                {"architecture", hf_architecture(model.family)},
                {"source", "transformers"}}}}
      .dump();
}

}  // namespace loom::checkpoint
