// `loom preprocess`: text documents -> a Megatron indexed dataset (PREFIX.bin/.idx).
//
// A pipeline with bounded memory: one reader thread cuts the inputs into batches of raw
// documents (text_source.h), N workers turn them into text (JSON, HTML) and token ids, and
// the calling thread writes the batches in input order. The output therefore does not
// depend on the number of workers, byte for byte.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/data/indexed_dataset.h"
#include "core/data/text_source.h"
#include "core/data/tokenizer.h"

namespace loom::core {

struct PreprocessOptions {
  std::vector<std::filesystem::path> inputs;  ///< files and directories (text_source.h)
  TextSourceOptions source;                   ///< JSON key, text mode, bad-line policy
  const Tokenizer* tokenizer = nullptr;       ///< required; shared by the workers
  std::filesystem::path output_prefix;        ///< writes PREFIX.bin and PREFIX.idx
  bool append_eod = false;                    ///< end every document with tokenizer->eod()
  int workers = 0;                            ///< tokenising threads; 0: one per CPU
  bool progress = false;  ///< on stderr: a bar on a terminal, else a line every 10 s
  int64_t batch_bytes = int64_t{1} << 20;  ///< raw bytes a worker takes at a time (about)
};

struct PreprocessStats {
  TextSourceStats source;  ///< documents written (all but bad lines), bad lines skipped
  /// Documents whose text has no tokens (an empty string), written as Megatron's
  /// preprocess_data.py writes them: a document with no sequence and no EOD. Included in
  /// source.documents. Whitespace-only text has tokens and is an ordinary document.
  int64_t documents_without_tokens = 0;
  int64_t tokens = 0;  ///< tokens written (EODs included)
  IndexedDType dtype = IndexedDType::kU16;
  int64_t bin_bytes = 0;  ///< size of PREFIX.bin
  int workers = 0;
  double seconds = 0;

  /// "1234 documents, 5.6M tokens (u16) from 12.3 MB in 2 files (3 without tokens, kept
  /// with no sequence); 1 bad line skipped; 1.9 s, 6.5 MB/s with 4 workers".
  std::string summary() const;
};

/// Tokenises options.inputs into options.output_prefix: every document, in input order, one
/// sequence each (Megatron's preprocess_data.py without --split-sentences). Throws IoError
/// for unreadable inputs, a bad JSONL line (unless options.source.skip_bad_lines), inputs
/// without any token, or output that cannot be written; InvalidArgument for a missing tokenizer, a
/// vocabulary no dtype holds, or append_eod with a tokenizer that has no EOD token. Nothing
/// is left at the output prefix on failure.
PreprocessStats preprocess(const PreprocessOptions& options);

}  // namespace loom::core
