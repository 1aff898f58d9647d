// TensorBoardWriter: scalars as TensorBoard event files, beside metrics.jsonl, so that
// `tensorboard --logdir RUN_DIR` shows a run's loss, learning rate, grad norm, throughput,
// validation loss and the modules' metrics without any TensorFlow or protobuf library.
//
// The file is TensorFlow's record format (what tf.summary and torch.utils.tensorboard
// write): records of [uint64 length][uint32 masked CRC-32C of the length][Event
// protobuf][uint32 masked CRC-32C of the data], the first Event holding file_version
// "brain.Event:2", each later one a wall time, a step and a Summary of simple values. Its
// name, events.out.tfevents.<seconds>.<host>.loom, is new for each run (a resumed run adds a
// file; TensorBoard reads them all).
#pragma once

#include <cstdint>
#include <filesystem>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace loom::core {

class TensorBoardWriter {
 public:
  /// Creates the event file in `dir` (created if needed). Throws IoError naming it.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  /// Appends one event of `step` with every (tag, value) and flushes it to the file.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::filesystem::path path_;
  std::FILE* out_ = nullptr;
};

/// CRC-32C (Castagnoli) of `size` bytes, bitwise (the records are small and rare).
uint32_t crc32c_bitwise(const void* data, size_t size);

}  // namespace loom::core
