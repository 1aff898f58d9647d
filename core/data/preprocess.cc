#include "core/data/preprocess.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/util/errors.h"
#include "loom/cpp/error.h"

namespace loom::core {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// A batch of raw documents, numbered in input order.
struct Batch {
  int64_t seq = 0;
  int64_t raw_bytes = 0;
  std::vector<RawDocument> docs;
};

// What a worker made of a batch: each document's fate and its tokens, back to back.
struct Tokenized {
  enum class Fate : uint8_t { kOk, kEmpty, kBad };
  int64_t raw_bytes = 0;
  std::vector<Fate> fates;          // (docs,)
  std::vector<size_t> ends;         // (docs,) end of each document in `tokens`
  std::vector<std::string> errors;  // messages of the bad lines, in order
  std::vector<int32_t> tokens;      // (tokens of the batch,)
};

// The queues between the reader, the workers and the writer. The reader may run at most
// `max_in_flight` batches ahead of the writer, which bounds memory whatever the speeds.
class Pipeline {
 public:
  explicit Pipeline(int64_t max_in_flight) : max_in_flight_(max_in_flight) {}

  // Reader side. Returns false when the pipeline is aborted.
  bool push(Batch&& batch) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return abort_ || next_seq_ - written_ < max_in_flight_; });
    if (abort_) return false;
    batch.seq = next_seq_++;
    todo_.push_back(std::move(batch));
    cv_.notify_all();
    return true;
  }
  void reader_done(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    reader_done_ = true;
    reader_error_ = error;
    cv_.notify_all();
  }

  // Worker side. Returns std::nullopt when there is no more work.
  std::optional<Batch> take() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return abort_ || !todo_.empty() || reader_done_; });
    if (abort_ || todo_.empty()) return std::nullopt;
    Batch batch = std::move(todo_.front());
    todo_.pop_front();
    return batch;
  }
  void put(int64_t seq, Tokenized&& result) {
    std::lock_guard lock(mutex_);
    done_.emplace(seq, std::move(result));
    cv_.notify_all();
  }
  void fail(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!worker_error_) worker_error_ = error;
    abort_ = true;
    cv_.notify_all();
  }
  void abort() {
    std::lock_guard lock(mutex_);
    abort_ = true;
    cv_.notify_all();
  }

  // Writer side: the next batch in input order, or std::nullopt at the end (throws the
  // reader's or a worker's error). Waits at most `timeout` (then returns std::nullopt with
  // *timed_out set) so the caller can draw progress.
  std::optional<Tokenized> next(Clock::duration timeout, bool* timed_out) {
    std::unique_lock lock(mutex_);
    *timed_out = false;
    auto ready = [&] {
      return worker_error_ || done_.contains(written_) || (reader_done_ && written_ == next_seq_);
    };
    if (!cv_.wait_for(lock, timeout, ready)) {
      *timed_out = true;
      return std::nullopt;
    }
    if (worker_error_) std::rethrow_exception(worker_error_);
    auto it = done_.find(written_);
    if (it == done_.end()) {
      // Every batch the reader made is written: what stopped it, if anything, comes now.
      if (reader_error_) std::rethrow_exception(reader_error_);
      return std::nullopt;
    }
    Tokenized result = std::move(it->second);
    done_.erase(it);
    ++written_;
    cv_.notify_all();
    return result;
  }

 private:
  const int64_t max_in_flight_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Batch> todo_;
  std::map<int64_t, Tokenized> done_;
  int64_t next_seq_ = 0;  // batches pushed
  int64_t written_ = 0;   // batches taken by the writer
  bool reader_done_ = false;
  bool abort_ = false;
  std::exception_ptr reader_error_, worker_error_;
};

Tokenized tokenize_batch(const Batch& batch, const PreprocessOptions& options,
                         std::optional<int32_t> eod, int64_t vocab_size) {
  Tokenized out;
  out.raw_bytes = batch.raw_bytes;
  out.fates.reserve(batch.docs.size());
  out.ends.reserve(batch.docs.size());
  std::string scratch, error;
  for (const RawDocument& raw : batch.docs) {
    std::optional<std::string_view> text = extract_text(raw, options.source, scratch, &error);
    Tokenized::Fate fate = Tokenized::Fate::kOk;
    if (!text) {
      fate = Tokenized::Fate::kBad;
      out.errors.push_back(error);
    } else {
      // As Megatron's preprocess_data.py: every document is kept, whitespace-only ones too
      // (their whitespace is tokens); one without tokens becomes a document with no
      // sequence, and gets no EOD.
      const size_t begin = out.tokens.size();
      options.tokenizer->encode_into(*text, out.tokens);
      if (out.tokens.size() == begin) {
        fate = Tokenized::Fate::kEmpty;
      } else {
        for (size_t i = begin; i < out.tokens.size(); ++i)
          LOOM_CHECK(out.tokens[i] >= 0 && out.tokens[i] < vocab_size, "tokenizer gave id ",
                     out.tokens[i], " outside its vocabulary of ", vocab_size, " for ",
                     raw.origin.describe());
        if (eod) out.tokens.push_back(*eod);
      }
    }
    out.fates.push_back(fate);
    out.ends.push_back(out.tokens.size());
  }
  return out;
}

// Progress on stderr: a redrawn bar on a terminal, else a plain line every 10 seconds.
class Progress {
 public:
  Progress(bool enabled, int64_t total_bytes)
      : enabled_(enabled),
        tty_(::isatty(2) == 1),
        total_(total_bytes),
        start_(Clock::now()),
        last_(tty_ ? Clock::time_point{} : start_) {}  // plain lines: the first after 10 s
  // A run that failed leaves the bar's line finished, so the error starts a line of its own.
  ~Progress() {
    if (open_line_) std::fputc('\n', stderr);
  }

  void update(int64_t bytes, int64_t documents, int64_t tokens, bool final = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!final && now - last_ < (tty_ ? std::chrono::milliseconds(200) : std::chrono::seconds(10)))
      return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double mb = bytes / 1e6, rate = seconds > 0 ? mb / seconds : 0;
    const double fraction = total_ > 0 ? std::min(1.0, double(bytes) / double(total_)) : 1.0;
    if (tty_) {
      constexpr int kWidth = 30;
      int filled = static_cast<int>(fraction * kWidth);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.resize(kWidth, '.');
      std::string eta = rate > 0 && !final
                            ? fmt::format(" ETA {:.0f}s", (total_ - bytes) / 1e6 / rate)
                            : std::string();
      std::fprintf(stderr, "\r[%s] %3.0f%% %.1f/%.1f MB %.1f MB/s %lld docs %lld tokens%s\x1b[K",
                   bar.c_str(), fraction * 100, mb, total_ / 1e6, rate,
                   static_cast<long long>(documents), static_cast<long long>(tokens), eta.c_str());
      open_line_ = !final;
      if (final) std::fputc('\n', stderr);
    } else if (!final) {
      std::fprintf(stderr, "preprocess: %.0f%% (%.1f of %.1f MB), %.1f MB/s, %lld documents\n",
                   fraction * 100, mb, total_ / 1e6, rate, static_cast<long long>(documents));
    }
    std::fflush(stderr);
  }

 private:
  bool enabled_, tty_;
  bool open_line_ = false;  // the bar is drawn and its line not ended
  int64_t total_;
  Clock::time_point start_, last_;
};

std::string si(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e4) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{}", static_cast<int64_t>(n));
}

const char* plural(int64_t n, const char* one, const char* many) { return n == 1 ? one : many; }

}  // namespace

std::string PreprocessStats::summary() const {
  std::string out =
      fmt::format("{} {}, {} {} ({}) from {:.1f} MB in {} {}", source.documents,
                  plural(source.documents, "document", "documents"), si(double(tokens)),
                  plural(tokens, "token", "tokens"), indexed_dtype_name(dtype), source.bytes / 1e6,
                  source.files, plural(source.files, "file", "files"));
  if (documents_without_tokens > 0)
    out += fmt::format(" ({} without tokens, kept with no sequence)", documents_without_tokens);
  if (source.bad_lines > 0)
    out += fmt::format("; {} bad {} skipped", source.bad_lines,
                       plural(source.bad_lines, "line", "lines"));
  out += fmt::format("; {:.2f} s, {:.1f} MB/s with {} {}", seconds,
                     seconds > 0 ? source.bytes / 1e6 / seconds : 0.0, workers,
                     plural(workers, "worker", "workers"));
  return out;
}

PreprocessStats preprocess(const PreprocessOptions& options) {
  const auto start = Clock::now();
  if (options.tokenizer == nullptr) fail(Code::kInvalidArgument, "preprocess: no tokenizer");
  const Tokenizer& tokenizer = *options.tokenizer;
  const int64_t vocab_size = tokenizer.vocab_size();
  if (vocab_size <= 0 || vocab_size > int64_t{1} << 31)
    fail(Code::kInvalidArgument,
         fmt::format("tokenizer {}: a vocabulary of {} ids fits no token dtype (u16 holds "
                     "fewer than 65500, i32 up to 2^31)",
                     tokenizer.describe(), vocab_size));
  std::optional<int32_t> eod;
  if (options.append_eod) {
    eod = tokenizer.eod();
    if (!eod)
      fail(Code::kInvalidArgument,
           fmt::format("--append-eod: tokenizer {} has no end-of-document token (neither "
                       "<|endoftext|> nor an eos token); add one to the tokenizer or drop "
                       "--append-eod",
                       tokenizer.describe()));
  }

  PreprocessStats stats;
  stats.dtype = indexed_dtype_for_vocab(vocab_size);
  stats.workers = options.workers > 0
                      ? options.workers
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::vector<fs::path> files = list_input_files(options.inputs, options.source);
  int64_t total_bytes = 0;
  for (const fs::path& f : files) {
    std::error_code ec;
    auto size = fs::file_size(f, ec);
    if (!ec) total_bytes += static_cast<int64_t>(size);
  }

  // Created before any thread starts: a prefix in a missing directory fails here. Destroyed
  // without finish() on any error below, which removes its temporary files.
  IndexedDatasetWriter writer(options.output_prefix, stats.dtype);

  Pipeline pipeline(2 * int64_t{stats.workers} + 2);
  TextSourceStats read_stats;  // the reader's: files and bytes
  std::vector<std::thread> threads;
  // Joins every thread however this function leaves.
  struct Joiner {
    Pipeline& pipeline;
    std::vector<std::thread>& threads;
    ~Joiner() {
      pipeline.abort();
      for (std::thread& t : threads)
        if (t.joinable()) t.join();
    }
  } joiner{pipeline, threads};

  threads.emplace_back([&] {
    std::exception_ptr error;
    try {
      Batch batch;
      bool open = true;
      auto send = [&] {
        open = open && pipeline.push(std::move(batch));
        batch = Batch{};
      };
      read_raw_documents(
          files, options.source,
          [&](RawDocument&& raw) {
            if (!open) return;
            batch.raw_bytes += static_cast<int64_t>(raw.bytes.size());
            batch.docs.push_back(std::move(raw));
            if (batch.raw_bytes >= options.batch_bytes || batch.docs.size() >= 8192) send();
          },
          &read_stats);
      if (!batch.docs.empty()) send();
    } catch (...) {
      error = std::current_exception();
    }
    pipeline.reader_done(error);
  });
  for (int w = 0; w < stats.workers; ++w)
    threads.emplace_back([&] {
      try {
        while (std::optional<Batch> batch = pipeline.take())
          pipeline.put(batch->seq, tokenize_batch(*batch, options, eod, vocab_size));
      } catch (...) {
        pipeline.fail(std::current_exception());
      }
    });

  Progress progress(options.progress, total_bytes);
  TextSourceStats& source = stats.source;
  int64_t done_bytes = 0;
  for (;;) {
    bool timed_out = false;
    std::optional<Tokenized> batch = pipeline.next(std::chrono::milliseconds(200), &timed_out);
    if (timed_out) {
      progress.update(done_bytes, source.documents, writer.tokens());
      continue;
    }
    if (!batch) break;
    size_t begin = 0, bad = 0;
    for (size_t d = 0; d < batch->fates.size(); ++d) {
      const size_t end = batch->ends[d];
      switch (batch->fates[d]) {
        case Tokenized::Fate::kOk:
          writer.add_document(std::span<const int32_t>(batch->tokens.data() + begin, end - begin));
          ++source.documents;
          break;
        case Tokenized::Fate::kEmpty:
          writer.add_document({});  // a document with no sequence
          ++source.documents;
          ++stats.documents_without_tokens;
          break;
        case Tokenized::Fate::kBad: {
          const std::string& error = batch->errors[bad++];
          if (!options.source.skip_bad_lines)
            throw IoError(error + "; --skip-bad-lines skips and counts such lines");
          if (source.bad_lines++ == 0) source.first_bad_line = error;
          break;
        }
      }
      begin = end;
    }
    done_bytes += batch->raw_bytes;
    progress.update(done_bytes, source.documents, writer.tokens());
  }
  source.files = read_stats.files;
  source.bytes = read_stats.bytes;
  if (writer.tokens() == 0)
    throw IoError(fmt::format(
        "no tokens in the inputs ({} {}, {} bytes; {} {}, {} without tokens; {} bad {} "
        "skipped); nothing written",
        source.files, plural(source.files, "file", "files"), source.bytes, source.documents,
        plural(source.documents, "document", "documents"), stats.documents_without_tokens,
        source.bad_lines, plural(source.bad_lines, "line", "lines")));
  writer.finish();
  stats.tokens = writer.tokens();
  stats.bin_bytes = writer.bin_bytes();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  progress.update(source.bytes, source.documents, stats.tokens, /*final=*/true);
  return stats;
}

}  // namespace loom::core
