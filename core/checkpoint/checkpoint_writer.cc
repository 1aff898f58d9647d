#include "core/checkpoint/checkpoint_writer.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/util/errors.h"
#include "core/util/files.h"
#include "core/util/gather_text.h"
#include "core/util/log.h"
#include "loom/cpp/error.h"
#include "loom/cpp/object.h"
#include "loom/cpp/tensor.h"

namespace fs = std::filesystem;

namespace loom::core {

void checkpoint_fault_point(const char* point, int64_t iteration) {
  const char* env = std::getenv("LOOM_CHECKPOINT_FAULT");
  if (env == nullptr) return;
  // "POINT:ITERATION" kills every rank there; "POINT:ITERATION:RANK" only LOOM_RANK RANK.
  const char* rank = std::getenv("LOOM_RANK");
  if (std::string(env) == fmt::format("{}:{}", point, iteration) ||
      std::string(env) == fmt::format("{}:{}:{}", point, iteration, rank != nullptr ? rank : "0"))
    ::raise(SIGKILL);
}

namespace {

// Removes saves that a killed process left behind ("iter_0000100.tmp-1234").
void remove_stale_saves(const fs::path& root) {
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind("iter_", 0) != 0 ||
        (name.find(".tmp-") == std::string::npos && name.find(".old-") == std::string::npos))
      continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    log_info("checkpoint", fmt::format("removed {} (a save that did not finish)", name));
  }
}

// Writes `bytes` to `to` durably, creating the parent directory.
void write_copy_durably(const std::string& bytes, const fs::path& to) {
  fs::create_directories(to.parent_path());
  write_file_atomic(to, bytes);
}

uint64_t bytes_of(const SaveTensor& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.slice_shape()) n *= static_cast<uint64_t>(d);
  return n;
}

// Every rank's `failed` flag, combined: true when any rank failed. With no world, `failed`.
bool any_failed(ICommunicator* world, bool failed, const std::string& what) {
  if (world == nullptr || world->size() == 1) return failed;
  int32_t flag = failed ? 1 : 0;
  TensorView v = make_view(&flag, DType::kI32, {1}, kCpu);
  throw_if_error(world->all_reduce(&v, ReduceOp::kMax, nullptr), what);
  return flag != 0;
}

// Rank 0's process id on every rank: the shared name of the temporary directory.
int64_t shared_tag(ICommunicator* world) {
  int64_t tag = ::getpid();
  if (world == nullptr || world->size() == 1) return tag;
  TensorView v = make_view(&tag, DType::kI64, {1}, kCpu);
  throw_if_error(world->broadcast(&v, 0, nullptr), "checkpoint: agreeing on the directory");
  return tag;
}

}  // namespace

CheckpointWriter::CheckpointWriter(PluginManager& plugins, CheckpointWriterOptions options)
    : plugins_(plugins), options_(std::move(options)) {
  object_ = make_checkpoint_format(plugins_, options_.format, "/checkpoint/format");
  format_ = interface_cast<ICheckpointFormat>(object_.get());
  if (format_ == nullptr)
    throw PluginError(Code::kAbiMismatch, "/checkpoint/format: not a checkpoint_format");
  std::error_code ec;
  fs::create_directories(options_.root, ec);
  if (ec)
    throw IoError(
        fmt::format("checkpoint directory {}: cannot create: {} (set checkpoint.dir to "
                    "a writable directory)",
                    options_.root.string(), ec.message()));
  if (options_.world == nullptr || options_.world->rank() == 0) {
    remove_stale_saves(options_.root);
    remove_stale_latest(options_.root);
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log_warning("checkpoint", fmt::format("the last background save failed: {}", e.what()));
    }
  }
}

void CheckpointWriter::wait() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

std::optional<fs::path> CheckpointWriter::last_saved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_saved_;
}

void CheckpointWriter::save(int64_t iteration, const std::vector<SaveTensor>& tensors,
                            nlohmann::json metadata) {
  wait();
  nlohmann::json table = nlohmann::json::object();
  for (const SaveTensor& t : tensors)
    table[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}};
  bool several = options_.world != nullptr && options_.world->size() > 1;
  // Ranks that save together may hold different tensors (pipeline stages): the table lists
  // every rank's.
  if (several) {
    for (const std::string& text :
         all_gather_text(*options_.world, table.dump(), "checkpoint: gathering the tensor table")) {
      const nlohmann::json theirs = nlohmann::json::parse(text);
      for (const auto& [name, entry] : theirs.items()) table[name] = entry;
    }
  }
  metadata["tensors"] = std::move(table);
  metadata["iteration"] = iteration;
  if (!options_.async || several) {
    Job job{iteration, tensors, {}, std::move(metadata)};
    write(job);
    return;
  }
  // Snapshot: the caller's memory may change as soon as we return.
  auto job = std::make_shared<Job>();
  job->iteration = iteration;
  job->metadata = std::move(metadata);
  job->owned.reserve(tensors.size());
  for (const SaveTensor& t : tensors) {
    uint64_t n = bytes_of(t);
    job->owned.emplace_back(static_cast<size_t>(n));
    if (n) std::memcpy(job->owned.back().data(), t.data, static_cast<size_t>(n));
    SaveTensor copy = t;
    copy.data = job->owned.back().data();
    job->tensors.push_back(std::move(copy));
  }
  worker_ = std::thread([this, job] {
    try {
      write(*job);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
  });
}

void write_checkpoint_directory(ICheckpointFormat& format, const fs::path& final_dir,
                                const std::vector<SaveTensor>& tensors,
                                const nlohmann::json& metadata,
                                const std::vector<std::pair<std::string, fs::path>>& extra_files,
                                int64_t iteration, ICommunicator* world) {
  fs::path parent = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
  std::string name = final_dir.filename().string();
  std::error_code ec;
  const int32_t rank = world != nullptr ? world->rank() : 0;
  const int32_t ranks = world != nullptr ? world->size() : 1;
  fs::path tmp = parent / fmt::format("{}.tmp-{}", name, shared_tag(world));
  std::string created_error;
  if (rank == 0) {
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec) || ec)
      created_error = fmt::format("checkpoint {}: cannot create: {}", tmp.string(),
                                  ec ? ec.message() : "exists");
  }
  if (any_failed(world, !created_error.empty(), "checkpoint: creating the directory"))
    throw IoError(!created_error.empty()
                      ? created_error
                      : fmt::format("checkpoint {}: rank 0 could not create it", tmp.string()));
  bool past_writes = false;  // every rank waits for rank 0's rename from there on
  try {
    std::vector<CheckpointTensor> views;
    views.reserve(tensors.size());
    for (const SaveTensor& t : tensors) {
      CheckpointTensor c{};
      c.struct_size = sizeof(CheckpointTensor);
      c.name = t.name.c_str();
      c.ndim = static_cast<int32_t>(t.shape.size());
      for (int32_t d = 0; d < c.ndim; ++d) {
        c.global_shape[d] = t.shape[static_cast<size_t>(d)];
        c.offset[d] = t.offset.empty() ? 0 : t.offset[static_cast<size_t>(d)];
      }
      c.data = make_view(const_cast<void*>(t.data), t.dtype, t.slice_shape().data(), c.ndim, kCpu);
      views.push_back(c);
    }
    std::string dir = tmp.string(), meta;
    std::vector<std::string> extra_bytes;
    std::string write_error;
    try {
      // The extra files (the tokenizer copy) are read once: their checksums go into the
      // metadata and the same bytes into the checkpoint.
      if (rank == 0 && !extra_files.empty()) {
        nlohmann::json with_files = metadata;
        nlohmann::json& record = with_files["files"] = nlohmann::json::object();
        for (const auto& [dest, from] : extra_files) {
          extra_bytes.push_back(read_file(from));
          record[dest] = file_record(extra_bytes.back());
        }
        meta = with_files.dump();
      } else if (metadata.contains("files")) {  // a record copied from another checkpoint
        nlohmann::json without = metadata;
        without.erase("files");
        meta = without.dump();
      } else {
        meta = metadata.dump();
      }
      throw_if_error(format.save(StringView{dir.data(), dir.size()}, views.data(),
                                 static_cast<int64_t>(views.size()),
                                 StringView{meta.data(), meta.size()}, rank, ranks),
                     fmt::format("checkpoint {}", final_dir.string()));
    } catch (const std::exception& e) {
      write_error = e.what();
      if (world == nullptr) throw;
    }
    checkpoint_fault_point("part", iteration);
    // Every rank's part is durable before rank 0 puts the directory in place.
    if (any_failed(world, !write_error.empty(), "checkpoint: the ranks' writes"))
      throw IoError(!write_error.empty()
                        ? write_error
                        : fmt::format("checkpoint {}: another rank failed to write its part (its "
                                      "message is in its log)",
                                      final_dir.string()));
    past_writes = true;
    if (rank != 0) {
      // Rank 0 renames it; a failure there fails the save everywhere.
      if (any_failed(world, false, "checkpoint: the rename"))
        throw IoError(
            fmt::format("checkpoint {}: rank 0 failed to put it in place", final_dir.string()));
      return;
    }
    for (size_t i = 0; i < extra_files.size(); ++i)
      write_copy_durably(extra_bytes[i], tmp / extra_files[i].first);
    sync_directory(tmp);
    checkpoint_fault_point("written", iteration);
    // A directory of the same name from an earlier run is replaced: moved aside first (a
    // crash in between leaves `latest` naming a missing directory, which readers skip),
    // removed after.
    fs::path old = parent / fmt::format("{}.old-{}", name, ::getpid());
    bool replaced = false;
    if (fs::exists(final_dir, ec)) {
      fs::remove_all(old, ec);
      fs::rename(final_dir, old, ec);
      if (ec)
        throw IoError(fmt::format("checkpoint {}: cannot move the existing one aside: {}",
                                  final_dir.string(), ec.message()));
      replaced = true;
    }
    fs::rename(tmp, final_dir, ec);
    if (ec)
      throw IoError(fmt::format("checkpoint {}: rename from {} failed: {}", final_dir.string(),
                                tmp.string(), ec.message()));
    sync_directory(parent);
    if (replaced) fs::remove_all(old, ec);
    any_failed(world, false, "checkpoint: the rename");
  } catch (...) {
    std::error_code ignored;
    if (rank == 0) {
      fs::remove_all(tmp, ignored);
      // The other ranks wait for the rename's outcome; tell them (unless they are gone).
      if (world != nullptr && ranks > 1 && past_writes) {
        try {
          any_failed(world, true, "checkpoint: the rename");
        } catch (...) {
        }
      }
    }
    throw;
  }
}

void CheckpointWriter::write(const Job& job) {
  auto t0 = std::chrono::steady_clock::now();
  const fs::path& root = options_.root;
  std::string name = iteration_dir_name(job.iteration);
  fs::path final_dir = root / name;
  write_checkpoint_directory(*format_, final_dir, job.tensors, job.metadata, options_.extra_files,
                             job.iteration, options_.world);
  if (options_.world != nullptr && options_.world->rank() != 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_saved_ = final_dir;
    return;  // rank 0 updates `latest` and removes old checkpoints
  }
  checkpoint_fault_point("renamed", job.iteration);
  write_file_atomic(root / "latest", name + "\n");
  uint64_t total = 0;
  for (const SaveTensor& t : job.tensors) total += bytes_of(t);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("checkpoint", fmt::format("saved {} ({:.1f} MiB in {:.2f} s)", final_dir.string(),
                                     static_cast<double>(total) / (1 << 20), seconds));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_saved_ = final_dir;
  }
  prune();
}

void CheckpointWriter::prune() {
  if (options_.keep <= 0) return;
  std::vector<fs::path> all = list_checkpoints(options_.root);
  for (size_t i = static_cast<size_t>(options_.keep); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i], ec);
    if (ec)
      log_warning("checkpoint", fmt::format("cannot remove old checkpoint {}: {}", all[i].string(),
                                            ec.message()));
  }
}

}  // namespace loom::core
