#include "core/train/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/util/errors.h"

namespace loom::core {
namespace {

// Protocol-buffer wire format, as much as an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void key(std::string& out, uint32_t field, uint32_t wire_type) {
  varint(out, (field << 3) | wire_type);
}
template <class T>
void little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

// Event {1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary}.
std::string event(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  little_endian(e, wall_time);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c_bitwise(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.loom",
                            static_cast<int64_t>(now_seconds()), host);
  out_ = std::fopen(path_.c_str(), "ab");
  if (out_ == nullptr) throw IoError(fmt::format("cannot write {}", path_.string()));
  std::string first = event(now_seconds(), 0);
  bytes_field(first, 3, "brain.Event:2");
  write_record(first);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_ != nullptr) std::fclose(out_);
}

void TensorBoardWriter::scalars(int64_t step,
                                const std::vector<std::pair<std::string, double>>& values) {
  // Summary {repeated Value value = 1}; Value {1: string tag, 2: float simple_value}.
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, 5);
    little_endian(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string e = event(now_seconds(), step);
  bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  const uint64_t length = data.size();
  little_endian(record, length);
  little_endian(record, masked(crc32c_bitwise(&length, sizeof(length))));
  record += data;
  little_endian(record, masked(crc32c_bitwise(data.data(), data.size())));
  if (std::fwrite(record.data(), 1, record.size(), out_) != record.size() ||
      std::fflush(out_) != 0)
    throw IoError(fmt::format("writing {}", path_.string()));
}

}  // namespace loom::core
