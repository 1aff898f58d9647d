// Input documents of `loom preprocess` and of the trainer's corpus preparation.
//
// Inputs are files and directories. A file's kind comes from its extension:
//   .jsonl .json       JSON lines: one object per line, the document is the string at
//                      options.json_key ("text"); blank lines are ignored
//   .txt .text .md .rst  plain text: the whole file, each line, or each blank-line-separated
//                      paragraph is a document (options.txt_mode)
//   .html .htm         a page reduced to its text (html_to_text)
// Directories are walked recursively in sorted path order (so the output is the same on
// every machine), taking files with one of options.extensions and skipping hidden entries
// (names starting with '.').
//
// A document that is only whitespace is skipped and counted, never handed on. A JSONL line
// that is not JSON, not an object, or lacks a string at the key is fatal by default (as in
// Megatron's preprocess_data.py), or skipped and counted with options.skip_bad_lines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::core {

/// How a plain-text file is cut into documents.
enum class TxtMode { kFile, kLine, kParagraph };

/// "file" | "line" | "paragraph"; throws InvalidArgument naming the choices otherwise.
TxtMode parse_txt_mode(std::string_view text);

/// What an input file holds, by extension.
enum class InputKind { kJsonl, kText, kHtml };

struct TextSourceOptions {
  std::string json_key = "text";      ///< the JSONL field holding the document
  TxtMode txt_mode = TxtMode::kFile;  ///< plain-text files: whole file, line or paragraph
  bool skip_bad_lines = false;        ///< skip (and count) bad JSONL lines instead of failing
  /// Extensions (lower case, with the dot) a directory walk takes; empty: every known one.
  /// Files named explicitly are taken whatever this says, if their kind is known.
  std::vector<std::string> extensions;
};

/// Where a document comes from, for messages.
struct DocumentOrigin {
  const std::filesystem::path* file = nullptr;  ///< valid while the documents are read
  int64_t line = 0;  ///< 1-based first line (JSONL, line and paragraph modes); 0: whole file
  /// "data/a.jsonl:17", or "page.html" for a whole file.
  std::string describe() const;
};

/// What reading the inputs did.
struct TextSourceStats {
  int64_t files = 0;
  int64_t documents = 0;        ///< handed on
  int64_t bad_lines = 0;        ///< JSONL lines skipped (skip_bad_lines)
  int64_t empty_documents = 0;  ///< skipped: nothing but whitespace
  int64_t bytes = 0;            ///< bytes read from the input files
  std::string first_bad_line;   ///< the message of the first skipped line, if any
};

/// The kind of `file` by extension (case-insensitive); std::nullopt when unknown.
std::optional<InputKind> input_kind(const std::filesystem::path& file);

/// The files `inputs` stand for: each file as given (its kind must be known), each
/// directory walked as the header comment says. Throws IoError for a missing input, a
/// directory without input files or an unreadable directory; InvalidArgument for a file of
/// unknown kind or when `inputs` is empty.
std::vector<std::filesystem::path> list_input_files(
    const std::vector<std::filesystem::path>& inputs, const TextSourceOptions& options);

/// Calls `fn` with every non-empty document of `inputs`, in input order, on this thread.
/// Throws IoError for unreadable inputs, for a bad JSONL line (file:line and what is wrong)
/// unless options.skip_bad_lines, and when the inputs hold no document at all.
TextSourceStats for_each_document(
    const std::vector<std::filesystem::path>& inputs, const TextSourceOptions& options,
    const std::function<void(std::string_view text, const DocumentOrigin& origin)>& fn);

// The two halves of for_each_document, for pipelines that turn raw documents into text on
// worker threads (preprocess): reading and cutting is cheap and sequential; JSON parsing
// and HTML reduction are not.

/// One document as read, before it is text: a JSONL line, a text file/line/paragraph, or
/// an HTML page.
struct RawDocument {
  InputKind kind = InputKind::kText;
  DocumentOrigin origin;
  std::string bytes;
};

/// Reads `files` (from list_input_files) in order and hands each raw document to `sink`.
/// Adds to stats->files and stats->bytes. Throws IoError for an unreadable file.
void read_raw_documents(const std::vector<std::filesystem::path>& files,
                        const TextSourceOptions& options,
                        const std::function<void(RawDocument&& raw)>& sink, TextSourceStats* stats);

/// The text of `raw`: a view of raw.bytes or of `scratch`. For a bad JSONL line returns
/// std::nullopt and sets `error` to "FILE:LINE: what is wrong". Thread-safe.
std::optional<std::string_view> extract_text(const RawDocument& raw,
                                             const TextSourceOptions& options, std::string& scratch,
                                             std::string* error);

/// True when `text` holds nothing but ASCII whitespace (such documents are skipped).
bool is_blank(std::string_view text);

/// The text of an HTML page: tags dropped; <script>, <style>, <head>, <template>, <svg>,
/// comments and Sphinx's "¶" header links dropped with their contents; entities decoded
/// (&nbsp; becomes a space); block elements become line breaks (paragraph-like ones a blank
/// line); whitespace collapsed outside <pre>; the result trimmed. When the page marks its
/// main content (an element with role="main", as Sphinx's <div class="body" role="main">,
/// or else a <main> element), only that is kept. (text_source_html.cc)
std::string html_to_text(std::string_view html);

/// Decodes the HTML entities of `text` (named ones from a table of the common ones,
/// &#NNN; and &#xHH;); unknown or malformed ones are kept as written.
std::string decode_html_entities(std::string_view text);

}  // namespace loom::core
