// UTF-8 decoding and the Unicode character classes of the pre-tokeniser regexes.
//
// Decoding never fails: a byte that does not start a well-formed UTF-8 sequence (a stray
// continuation byte, an overlong form, a surrogate, a value past U+10FFFF, a truncated
// sequence) is one character of its own with code point kInvalidCodePoint and class kOther,
// so every byte string splits into characters that cover it exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::core::unicode {

/// The classes the GPT-2 and Llama-3 patterns use, as Oniguruma (Hugging Face `tokenizers`)
/// defines them; see tools/unicode/gen_unicode_tables.py.
enum class CharClass : uint8_t {
  kOther = 0,
  kLetter = 1,  ///< \p{L}: Lu Ll Lt Lm Lo
  kNumber = 2,  ///< \p{N}: Nd Nl No
  kSpace = 3,   ///< \s: U+0009..U+000D, U+0085, Zs Zl Zp (= the White_Space property)
};

constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;

/// The Unicode version of the class tables ("14.0.0").
const char* unicode_version();

/// The class of a code point (kOther for kInvalidCodePoint and anything past U+10FFFF).
CharClass char_class(uint32_t cp);

/// One decoded character: its code point (kInvalidCodePoint for an invalid byte) and length in
/// bytes (1..4).
struct Utf8Char {
  uint32_t cp;
  uint32_t len;
};

/// Decodes the character at `p` (`p < end`).
inline Utf8Char decode_utf8(const char* p, const char* end) {
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  unsigned char c = s[0];
  if (c < 0x80) return {c, 1};
  size_t left = static_cast<size_t>(end - p);
  auto cont = [&](size_t i) { return i < left && (s[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) {
    if (cont(1)) return {(c & 0x1Fu) << 6 | (s[1] & 0x3Fu), 2};
  } else if (c >= 0xE0 && c <= 0xEF) {
    if (cont(1) && cont(2)) {
      uint32_t cp = (c & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {cp, 3};
    }
  } else if (c >= 0xF0 && c <= 0xF4) {
    if (cont(1) && cont(2) && cont(3)) {
      uint32_t cp = (c & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
      if (cp >= 0x10000 && cp <= 0x10FFFF) return {cp, 4};
    }
  }
  return {kInvalidCodePoint, 1};
}

/// Appends the UTF-8 encoding of `cp` (at most U+10FFFF) to `out`.
void append_utf8(uint32_t cp, std::string& out);

}  // namespace loom::core::unicode
