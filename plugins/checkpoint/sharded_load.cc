// ShardedReader: verifying a sharded checkpoint and assembling requested slices from it.
#include <algorithm>
#include <limits>
#include <memory>

#include "loom/cpp/json_input.h"
#include "plugins/checkpoint/crc32c.h"
#include "plugins/checkpoint/files.h"
#include "plugins/checkpoint/requests.h"
#include "plugins/checkpoint/sealed_json.h"
#include "plugins/checkpoint/sharded.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kRecover =
    "load an earlier checkpoint (training resumes from the newest good one)";

bool same_box(const Box& a, const Box& b) {
  for (int32_t d = 0; d < a.ndim; ++d)
    if (a.start[d] != b.start[d] || a.size[d] != b.size[d]) return false;
  return true;
}

// Elements of `want` covered by `pieces` (boxes inside it), counting overlaps once.
int64_t covered(const Box& want, const std::vector<Box>& pieces) {
  int64_t sum = 0;
  bool overlap = false;
  for (size_t i = 0; i < pieces.size(); ++i) {
    sum += volume(pieces[i]);
    Box o;
    for (size_t j = 0; j < i && !overlap; ++j) overlap = intersect(pieces[i], pieces[j], &o);
  }
  if (!overlap) return sum;
  // Overlapping pieces: mark the covered elements of `want` (one byte each).
  std::vector<unsigned char> mark(static_cast<size_t>(volume(want)), 0);
  Strided dst = contiguous(mark.data(), DType::kU8, want.start, want.size, want.ndim);
  std::vector<unsigned char> ones;
  for (const Box& p : pieces) {
    ones.assign(static_cast<size_t>(volume(p)), 1);
    copy_region(contiguous(ones.data(), DType::kU8, p.start, p.size, p.ndim), dst, p);
  }
  return static_cast<int64_t>(std::count(mark.begin(), mark.end(), 1));
}

}  // namespace

ShardedReader::ShardedReader(fs::path dir) : dir_(std::move(dir)) {
  fs::path meta_path = dir_ / "metadata.json";
  nlohmann::json meta = open_sealed_json(
      read_whole_file(meta_path, Code::kNotFound,
                      "not a sharded checkpoint, or rank 0 did not finish saving it"),
      meta_path, kRecover);
  JsonIn root(meta, meta_path.string(), Code::kDataLoss,
              "the file is damaged (its checksum matched: it was written this way); " +
                  std::string(kRecover));
  if (!meta.is_object() || !meta.contains("format") || !meta["format"].is_string() ||
      meta["format"].get<std::string>() != kShardedFormat)
    fail(Code::kDataLoss, meta_path.string() + " is not a loom-sharded metadata file");
  if (root["version"].int64(1, std::numeric_limits<int64_t>::max()) > kShardedVersion)
    fail(Code::kUnimplemented, meta_path.string() + " has format version " +
                                   meta["version"].dump() +
                                   "; this loom reads version 1: upgrade loom");
  // A world beyond any real job would only make the loop below open that many files.
  auto world = static_cast<int32_t>(root["world"].int64(1, 1 << 20));
  root["loom"].expect_object();
  loom_ = std::move(meta["loom"]);
  for (int32_t r = 0; r < world; ++r) {
    fs::path path = dir_ / "shards" / (shard_stem(r) + ".json");
    std::string hint = "rank " + std::to_string(r) + " of " + std::to_string(world) +
                       " did not finish saving or the file was removed; " + kRecover;
    ShardIndex index = index_from_json(
        open_sealed_json(read_whole_file(path, Code::kDataLoss, hint), path, kRecover), path);
    if (index.rank != r || index.world != world)
      fail(Code::kDataLoss, path.string() + " belongs to rank " + std::to_string(index.rank) +
                                " of " + std::to_string(index.world) + ", not rank " +
                                std::to_string(r) + " of " + std::to_string(world));
    // The .bin must hold every byte the index lists.
    fs::path bin = dir_ / "shards" / index.bin;
    ReadOnlyFile file(bin, Code::kDataLoss, hint);
    if (file.size() < index.bin_size) {
      std::string cut = "padding";
      for (const ShardEntry& e : index.entries)
        if (e.byte_offset + e.nbytes > file.size()) {
          cut = "tensor '" + e.name + "' " + box_text(e.slice);
          break;
        }
      fail(Code::kDataLoss, bin.string() + " is truncated: " + std::to_string(file.size()) +
                                " bytes of " + std::to_string(index.bin_size) + "; " + cut +
                                " is cut off; " + kRecover);
    }
    for (size_t i = 0; i < index.entries.size(); ++i) {
      const ShardEntry& e = index.entries[i];
      auto& refs = by_name_[e.name];
      if (!refs.empty()) {
        // The first piece may be this rank's own (a rank that saved several slices of one
        // tensor), whose index is not among shards_ yet.
        const ShardEntry& first = refs.front().first == r
                                      ? index.entries[static_cast<size_t>(refs.front().second)]
                                      : entry(refs.front());
        bool same = first.ndim == e.ndim && first.dtype == e.dtype;
        for (int32_t d = 0; same && d < e.ndim; ++d)
          same = first.global_shape[d] == e.global_shape[d];
        if (!same)
          fail(Code::kDataLoss, path.string() + ": tensor '" + e.name + "' is " +
                                    dtype_name(e.dtype) + " " + shape_text(e.global_shape, e.ndim) +
                                    " here but " + dtype_name(first.dtype) + " " +
                                    shape_text(first.global_shape, first.ndim) + " in rank " +
                                    std::to_string(refs.front().first) + "'s index");
      }
      refs.push_back({r, i});
    }
    shards_.push_back(std::move(index));
  }
}

fs::path ShardedReader::bin_path(int32_t rank) const {
  return dir_ / "shards" / shards_[static_cast<size_t>(rank)].bin;
}

std::vector<ShardedReader::PieceRef> ShardedReader::plan(const CheckpointTensor& r,
                                                         const Box& want) const {
  const std::string name = r.name;
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    const nlohmann::json& listed = loom_.contains("tensors") ? loom_["tensors"] : loom_;
    if (listed.is_object() && listed.contains(name))
      fail(Code::kDataLoss, "tensor '" + name + "' is listed in " +
                                (dir_ / "metadata.json").string() + " but no shard holds it; " +
                                kRecover);
    fail(Code::kNotFound, "tensor '" + name + "' is not in the checkpoint " + dir_.string() + " (" +
                              std::to_string(by_name_.size()) + " tensors; `loom " +
                              "checkpoint inspect` lists them)");
  }
  const ShardEntry& stored = entry(it->second.front());
  bool same = stored.ndim == r.ndim;
  for (int32_t d = 0; same && d < r.ndim; ++d) same = stored.global_shape[d] == r.global_shape[d];
  if (!same)
    fail(Code::kInvalidArgument, "tensor '" + name + "' has the shape " +
                                     shape_text(stored.global_shape, stored.ndim) + " in " +
                                     dir_.string() + " but " + global_shape_text(r) +
                                     " was requested: the model differs from the one that saved "
                                     "it");
  if (!convertible(stored.dtype, r.data.dtype))
    fail(Code::kInvalidArgument, "tensor '" + name + "' is stored as " + dtype_name(stored.dtype) +
                                     " and cannot be read as " + dtype_name(r.data.dtype) +
                                     " (only f32, bf16 and f16 convert into each other)");
  std::vector<PieceRef> pieces;
  if (volume(want) == 0) return pieces;
  std::vector<Box> parts, overlaps;
  for (const PieceRef& p : it->second) {
    const ShardEntry& e = entry(p);
    Box o;
    if (!intersect(e.slice, want, &o)) continue;
    bool duplicate = false;  // the same slice saved by several ranks (replicas): read one
    for (const Box& b : parts) duplicate = duplicate || same_box(b, e.slice);
    if (duplicate) continue;
    parts.push_back(e.slice);
    overlaps.push_back(o);
    pieces.push_back(p);
  }
  if (covered(want, overlaps) < volume(want))
    fail(Code::kDataLoss, "tensor '" + name + "': the saved slices do not cover the requested " +
                              box_text(want) + " (" + std::to_string(it->second.size()) +
                              " pieces in " + dir_.string() + "/shards); a rank's shard lacks " +
                              "entries; " + kRecover);
  return pieces;
}

void ShardedReader::load(CheckpointTensor* requests, int64_t count) const {
  if (count < 0 || (count > 0 && requests == nullptr))
    fail(Code::kInvalidArgument, "sharded load: no request array");
  // For every stored piece, the requests it feeds (each piece is read once).
  std::map<PieceRef, std::vector<int64_t>> readers;
  std::vector<Box> wanted;
  for (int64_t i = 0; i < count; ++i) {
    wanted.push_back(checked_slice(requests[i], "sharded load"));
    for (const PieceRef& p : plan(requests[i], wanted.back())) readers[p].push_back(i);
  }
  std::vector<std::unique_ptr<ReadOnlyFile>> files(shards_.size());
  std::vector<unsigned char> bytes;
  for (const auto& [ref, users] : readers) {
    const ShardEntry& e = entry(ref);
    auto& file = files[static_cast<size_t>(ref.first)];
    if (!file)
      file = std::make_unique<ReadOnlyFile>(bin_path(ref.first), Code::kDataLoss, kRecover);
    bytes.resize(static_cast<size_t>(e.nbytes));
    std::string piece = "tensor '" + e.name + "' " + box_text(e.slice);
    try {
      file->read(e.byte_offset, bytes.data(), bytes.size());
    } catch (const Error& error) {
      fail(error.code(), std::string(error.what()) + "; reading " + piece);
    }
    uint32_t crc = crc32c(bytes.data(), bytes.size());
    if (crc != e.crc)
      fail(Code::kDataLoss, file->path().string() + ": " + piece + " fails its CRC-32C check " +
                                "(stored " + crc32c_hex(e.crc) + ", computed " + crc32c_hex(crc) +
                                "): the file is damaged; " + kRecover);
    Strided src = contiguous(bytes.data(), e.dtype, e.slice.start, e.slice.size, e.ndim);
    for (int64_t i : users) {
      Box o;
      const Box& want = wanted[static_cast<size_t>(i)];
      if (intersect(e.slice, want, &o)) copy_region(src, strided_of(requests[i]), o);
    }
  }
}

}  // namespace loom::checkpoint
