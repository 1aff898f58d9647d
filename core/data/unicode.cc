#include "core/data/unicode.h"

namespace loom::core::unicode {
namespace {

#include "core/data/unicode_tables.inc"

}  // namespace

const char* unicode_version() { return kUnicodeVersion; }

CharClass char_class(uint32_t cp) {
  if (cp >= 0x110000) return CharClass::kOther;
  uint32_t block = kUnicodeBlockIndex[cp >> kUnicodeBlockShift];
  uint32_t bits = kUnicodeBlocks[block][(cp & 127) >> 2] >> (2 * (cp & 3));
  return static_cast<CharClass>(bits & 3);
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | cp >> 6));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | cp >> 12));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | cp >> 18));
    out.push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace loom::core::unicode
