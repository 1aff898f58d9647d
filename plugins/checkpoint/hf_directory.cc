#include "plugins/checkpoint/hf_directory.h"

#include <map>

#include "loom/cpp/json_input.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;

HfDirectory::HfDirectory(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::path config = dir_ / kHfConfig;
  std::string text =
      read_whole_file(config, Code::kNotFound,
                      "a Hugging Face model directory needs config.json (transformers' "
                      "save_pretrained writes it)");
  config_ = parse_json_input(text, config.string(), Code::kDataLoss,
                             "the file is damaged; download or export the model again");
  if (!config_.is_object())
    fail(Code::kDataLoss, config.string() + " is not a JSON object: the file is damaged");
  if (fs::exists(dir_ / kHfWeights, ec)) {
    files_.push_back(std::make_unique<SafetensorsReader>(dir_ / kHfWeights));
    return;
  }
  if (!fs::exists(dir_ / kHfIndex, ec)) {
    if (fs::exists(dir_ / "pytorch_model.bin", ec) ||
        fs::exists(dir_ / "pytorch_model.bin.index.json", ec))
      fail(Code::kUnimplemented,
           dir_.string() +
               " holds pytorch_model.bin, which loom does not read (it is a pickle): "
               "convert it with transformers, e.g. AutoModelForCausalLM."
               "from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)");
    fail(Code::kNotFound, dir_.string() + " has neither " + kHfWeights + " nor " + kHfIndex);
  }
  fs::path index_path = dir_ / kHfIndex;
  nlohmann::json index =
      parse_json_input(read_whole_file(index_path, Code::kNotFound, ""), index_path.string(),
                       Code::kDataLoss, "the file is damaged; download or export the model again");
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(Code::kDataLoss,
         index_path.string() + " has no \"weight_map\" object: the file is damaged");
  std::map<std::string, size_t> opened;
  for (auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      fail(Code::kDataLoss, index_path.string() + ": the file of '" + name + "' is not a string");
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
      fail(Code::kDataLoss, index_path.string() + " names the file '" + f + "' for '" + name +
                                "': expected a file name in the same directory");
    auto [it, added] = opened.emplace(f, files_.size());
    if (added) files_.push_back(std::make_unique<SafetensorsReader>(dir_ / f));
    if (files_[it->second]->find(name) == nullptr)
      fail(Code::kDataLoss, index_path.string() + " places '" + name + "' in " + f +
                                ", which does not hold it: the download is incomplete or mixed");
  }
  if (files_.empty()) fail(Code::kDataLoss, index_path.string() + " lists no tensors");
}

HfDirectory::Found HfDirectory::find(const std::string& name,
                                     const std::string& base_prefix) const {
  std::vector<std::string> names{name};
  if (name.rfind(base_prefix, 0) == 0) names.push_back(name.substr(base_prefix.size()));
  for (const std::string& n : names)
    for (const auto& file : files_)
      if (const SafetensorsTensor* t = file->find(n)) return {file.get(), t};
  return {};
}

std::string HfDirectory::weight_files() const {
  std::string s;
  for (const auto& file : files_) s += (s.empty() ? "" : ", ") + file->path().filename().string();
  return s;
}

std::string HfDirectory::metadata(const std::string& key) const {
  for (const auto& file : files_)
    if (file->metadata().contains(key)) return file->metadata()[key].get<std::string>();
  return "";
}

}  // namespace loom::checkpoint
