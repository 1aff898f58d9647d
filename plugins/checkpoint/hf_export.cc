// export_hf: loom weights to a Hugging Face model directory.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/files.h"
#include "plugins/checkpoint/hf_directory.h"
#include "plugins/checkpoint/hf_io.h"
#include "plugins/checkpoint/hf_layout.h"
#include "plugins/checkpoint/requests.h"
#include "plugins/checkpoint/safetensors_file.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kSharded =
    "; save with the sharded format and export from it with `loom checkpoint convert`";

// The model weights handed to save, by loom name without "model.", checked to be whole.
std::map<std::string, const CheckpointTensor*> model_weights(const CheckpointTensor* tensors,
                                                             int64_t count) {
  std::map<std::string, const CheckpointTensor*> given;
  for (int64_t i = 0; i < count; ++i) {
    const CheckpointTensor& t = tensors[i];
    Box slice = checked_slice(t, "safetensors save");
    std::string name = t.name;
    if (name.rfind("model.", 0) != 0) continue;  // optimizer states are not exported
    for (int32_t d = 0; d < t.ndim; ++d)
      if (slice.start[d] != 0 || slice.size[d] != t.global_shape[d])
        fail(Code::kUnimplemented, "safetensors save: tensor '" + name + "' is the slice " +
                                       box_text(slice) + " of " + global_shape_text(t) +
                                       ", but the export needs every weight whole on rank 0" +
                                       kSharded);
    if (!convertible(t.data.dtype, DType::kF32))
      fail(Code::kUnimplemented, "safetensors save: tensor '" + name + "' is " +
                                     dtype_name(t.data.dtype) +
                                     "; the export writes f32, bf16 or f16 weights");
    given[name.substr(6)] = &t;
  }
  return given;
}

// The bytes of `t` in row-major order (packed when its view is strided).
const unsigned char* row_major(const CheckpointTensor& t, std::vector<unsigned char>& scratch) {
  if (is_contiguous(t.data)) return static_cast<const unsigned char*>(t.data.data);
  Box whole = checked_slice(t, "safetensors save");
  scratch.resize(static_cast<size_t>(volume(whole)) * dtype_size(t.data.dtype));
  copy_region(strided_of(t),
              contiguous(scratch.data(), t.data.dtype, whole.start, whole.size, t.ndim), whole);
  return scratch.data();
}

// Writes into `out` the Hugging Face tensor of `hf_shape` that `blocks` of the loom tensor
// `t` (whose data is `c`) make, cast to `to`.
void fill_hf_tensor(const CheckpointTensor& c, const TensorLayout& t,
                    const std::vector<const RowBlock*>& blocks,
                    const std::vector<int64_t>& hf_shape, DType to, unsigned char* out) {
  std::vector<unsigned char> packed, staged;
  const unsigned char* loom = row_major(c, packed);
  const DType from = c.data.dtype;
  int64_t n = 1;
  for (int64_t e : hf_shape) n *= e;
  unsigned char* hf = out;
  if (from != to) {
    staged.resize(static_cast<size_t>(n) * dtype_size(from));
    hf = staged.data();
  }
  for (const RowBlock* b : blocks)
    copy_block(*b, t.shape, hf_shape, dtype_size(from), const_cast<unsigned char*>(loom), hf,
               false);
  if (from != to) convert(staged.data(), from, out, to, n);
}

}  // namespace

void export_hf(const fs::path& dir, const CheckpointTensor* tensors, int64_t count,
               const std::string& metadata_json, int32_t rank, DType dtype) {
  json metadata = parse_json_input(metadata_json, "safetensors save: the metadata");
  if (!metadata.is_object())
    fail(Code::kInvalidArgument, "safetensors save: the metadata is not a JSON object");
  HfModel model = hf_model_from_metadata(metadata);
  if (rank != 0) return;  // rank 0 holds (and writes) every weight
  if (count < 0 || (count > 0 && tensors == nullptr))
    fail(Code::kInvalidArgument, "safetensors save: no tensor array");
  const std::string arch = hf_architecture(model.family);
  HfLayout layout = hf_layout(model);
  std::map<std::string, const CheckpointTensor*> given = model_weights(tensors, count);
  for (const auto& [name, t] : given)
    if (layout.find(name) == nullptr)
      fail(Code::kUnimplemented, "safetensors save: tensor 'model." + name +
                                     "' has no counterpart in " + arch +
                                     " (is the spec's model node the one these weights belong "
                                     "to?)" +
                                     kSharded);
  // Which loom tensor and blocks make each Hugging Face tensor.
  std::map<std::string, std::pair<const TensorLayout*, std::vector<const RowBlock*>>> sources;
  json listed = json::object();
  for (const TensorLayout& t : layout.tensors) {
    auto it = given.find(t.loom);
    if (it == given.end())
      fail(Code::kNotFound, "safetensors save: tensor 'model." + t.loom + "' is part of a " + arch +
                                " but was not given to save");
    const CheckpointTensor& c = *it->second;
    if (std::vector<int64_t>(c.global_shape, c.global_shape + c.ndim) != t.shape)
      fail(Code::kInvalidArgument, "safetensors save: tensor 'model." + t.loom + "' has shape " +
                                       global_shape_text(c) + " but the spec implies " +
                                       shape_text(t.shape));
    DType out = dtype == DType::kInvalid ? c.data.dtype : dtype;
    listed["model." + t.loom] = {{"dtype", dtype_name(out)}, {"shape", t.shape}};
    for (const RowBlock& b : t.blocks) {
      sources[b.hf].first = &t;
      sources[b.hf].second.push_back(&b);
    }
  }
  // The dtype of config.json and of the tensors loom has no counterpart of.
  DType main = dtype == DType::kInvalid ? DType::kF32 : dtype;
  if (const TensorLayout* e = layout.find("embedding.word_embeddings.weight"))
    main = dtype_from_name(listed["model." + e->loom]["dtype"].get<std::string>().c_str());
  std::vector<SafetensorsOutput> outputs;
  for (const auto& [hf, shape] : layout.hf_shapes) {
    if (std::find(layout.zeros.begin(), layout.zeros.end(), hf) != layout.zeros.end()) {
      int64_t n = 1;
      for (int64_t e : shape) n *= e;
      const size_t bytes = static_cast<size_t>(n) * dtype_size(main);
      outputs.push_back(
          {hf, main, shape, [bytes](unsigned char* out) { std::memset(out, 0, bytes); }});
      continue;
    }
    const TensorLayout* t = sources.at(hf).first;
    std::vector<const RowBlock*> blocks = sources.at(hf).second;
    const CheckpointTensor* c = given.at(t->loom);
    DType to = dtype == DType::kInvalid ? c->data.dtype : dtype;
    outputs.push_back({hf, to, shape, [c, t, blocks, shape = shape, to](unsigned char* out) {
                         fill_hf_tensor(*c, *t, blocks, shape, to, out);
                       }});
  }
  json kept = metadata;
  kept["tensors"] = listed;
  kept["format"] = {{"impl", "safetensors"}, {"architecture", arch}};
  write_safetensors(dir / kHfWeights, std::move(outputs),
                    {{"format", "pt"}, {"loom", kept.dump()}});
  write_file_durably(dir / kHfConfig, hf_config(model, main).dump(2) + "\n");
  if (model.bos || model.eos) {
    json generation = {{"_from_model_config", true}};
    if (model.bos) generation["bos_token_id"] = *model.bos;
    if (model.eos) generation["eos_token_id"] = *model.eos;
    write_file_durably(dir / "generation_config.json", generation.dump(2) + "\n");
  }
  fsync_directory(dir);
}

}  // namespace loom::checkpoint
