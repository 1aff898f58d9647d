#include "core/data/npy_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/util/errors.h"
#include "core/util/files.h"

namespace loom::core {

namespace {

int64_t descr_width(const std::string& descr) {
  if (descr == "<i4" || descr == "<u4") return 4;
  if (descr == "<i8") return 8;
  return 0;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}, ", shape[i]);
  if (shape.size() > 1)
    s.resize(s.size() - 1), s.back() = ')';
  else
    s.pop_back(), s.back() = ',', s += ")";
  if (shape.empty()) s = "()";
  return s;
}

}  // namespace

void write_npy(const std::filesystem::path& path, const std::string& descr,
               const std::vector<int64_t>& shape, const std::vector<int64_t>& values) {
  int64_t width = descr_width(descr);
  if (width == 0)
    throw InvalidArgument(
        fmt::format("write_npy {}: dtype '{}' is not supported", path.string(), descr));
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count != static_cast<int64_t>(values.size()))
    throw InvalidArgument(fmt::format("write_npy {}: {} values for shape {}", path.string(),
                                      values.size(), shape_text(shape)));
  // Header: the dict, padded with spaces so that magic + lengths + header is a multiple of 64
  // bytes, ending in a newline (numpy's own layout).
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   descr, shape_text(shape));
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  size_t at = bytes.size();
  bytes.resize(at + values.size() * static_cast<size_t>(width));
  for (int64_t v : values) {
    bool fits = descr == "<i8" ||
                (descr == "<i4" ? v >= INT32_MIN && v <= INT32_MAX : v >= 0 && v <= UINT32_MAX);
    if (!fits)
      throw InvalidArgument(
          fmt::format("write_npy {}: value {} does not fit {}", path.string(), v, descr));
    for (int64_t b = 0; b < width; ++b)
      bytes[at++] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * b));
  }
  write_file_atomic(path, bytes);
}

std::optional<NpyArray> read_npy(const std::filesystem::path& path, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<NpyArray> {
    if (why != nullptr) *why = fmt::format("{}: {}", path.string(), reason);
    return std::nullopt;
  };
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return fail("missing");
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return fail("not a .npy file");
  if (bytes[6] != 1) return fail("not .npy format version 1.0");
  size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  if (bytes.size() < 10 + hlen) return fail("truncated header");
  std::string header = bytes.substr(10, hlen);
  NpyArray out;
  auto field = [&](const std::string& key) -> std::string {
    size_t k = header.find("'" + key + "':");
    if (k == std::string::npos) return {};
    return header.substr(k + key.size() + 3);
  };
  std::string d = field("descr");
  size_t q1 = d.find('\''), q2 = d.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) return fail("no descr in header");
  out.descr = d.substr(q1 + 1, q2 - q1 - 1);
  int64_t width = descr_width(out.descr);
  if (width == 0) return fail(fmt::format("dtype '{}' is not an index dtype", out.descr));
  if (field("fortran_order").rfind(" False", 0) != 0) return fail("not C-ordered");
  std::string s = field("shape");
  size_t open = s.find('('), close = s.find(')');
  if (open == std::string::npos || close == std::string::npos) return fail("no shape in header");
  std::string dims = s.substr(open + 1, close - open - 1);
  int64_t count = 1;
  for (size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t used = 0;
    int64_t v = std::stoll(dims.substr(i), &used);
    out.shape.push_back(v);
    count *= v;
    i += used;
  }
  size_t data = 10 + hlen;
  if (bytes.size() != data + static_cast<size_t>(count * width))
    return fail(fmt::format("{} bytes of data, {} expected", bytes.size() - data, count * width));
  out.values.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + data + i * width);
    uint64_t u = 0;
    for (int64_t b = 0; b < width; ++b) u |= static_cast<uint64_t>(p[b]) << (8 * b);
    if (out.descr == "<i4")
      out.values[i] = static_cast<int32_t>(static_cast<uint32_t>(u));
    else
      out.values[i] = static_cast<int64_t>(u);
  }
  return out;
}

}  // namespace loom::core
