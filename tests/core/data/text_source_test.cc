// Input documents for preprocess: JSONL (bad lines fatal or skipped, with file:line),
// plain text in its three modes, HTML reduced to text, directory walking order.
#include "core/data/text_source.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/util/errors.h"

namespace loom::core {
namespace {

namespace fs = std::filesystem;

fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "text_source" / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

fs::path write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return path;
}

struct Doc {
  std::string text, origin;
};

std::vector<Doc> read_all(const std::vector<fs::path>& inputs, const TextSourceOptions& options,
                          TextSourceStats* stats = nullptr) {
  std::vector<Doc> docs;
  TextSourceStats s =
      for_each_document(inputs, options, [&](std::string_view text, const DocumentOrigin& origin) {
        docs.push_back({std::string(text), origin.describe()});
      });
  if (stats != nullptr) *stats = s;
  return docs;
}

std::string io_error(const std::vector<fs::path>& inputs, const TextSourceOptions& options) {
  try {
    read_all(inputs, options);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an IoError: " << e.what();
  }
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---- JSONL ----------------------------------------------------------------------------

TEST(Jsonl, ReadsTheKeyInOrderWithLineNumbers) {
  fs::path f = write(test_dir() / "a.jsonl",
                     "{\"text\": \"first\", \"id\": 1}\n"
                     "\n"
                     "{\"meta\": {\"text\": \"nested is not it\"}, \"text\": \"sec\\u00e9ond\"}\r\n"
                     "   \n"
                     "{\"text\": \"third\"}");  // no final newline
  TextSourceStats stats;
  std::vector<Doc> docs = read_all({f}, {}, &stats);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "first");
  EXPECT_EQ(docs[1].text, "sec\xc3\xa9ond");
  EXPECT_EQ(docs[2].text, "third");
  EXPECT_EQ(docs[0].origin, f.string() + ":1");
  EXPECT_EQ(docs[1].origin, f.string() + ":3");
  EXPECT_EQ(docs[2].origin, f.string() + ":5");
  EXPECT_EQ(stats.documents, 3);
  EXPECT_EQ(stats.files, 1);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(fs::file_size(f)));
}

TEST(Jsonl, OtherKey) {
  fs::path f = write(test_dir() / "a.json", "{\"text\": 1, \"content\": \"body\"}\n");
  TextSourceOptions options;
  options.json_key = "content";
  std::vector<Doc> docs = read_all({f}, options);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "body");
}

TEST(Jsonl, BadLineIsFatalByDefault) {
  fs::path f = write(test_dir() / "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"broken\n");
  std::string e = io_error({f}, {});
  EXPECT_HAS(e, f.string() + ":2: not JSON");
  EXPECT_HAS(e, "--skip-bad-lines");
}

TEST(Jsonl, BadLinesSkippedAndCounted) {
  fs::path f = write(test_dir() / "a.jsonl",
                     "{\"text\": \"one\"}\n"
                     "not json\n"
                     "{\"body\": \"x\", \"id\": 3}\n"
                     "{\"text\": 5}\n"
                     "[1, 2]\n"
                     "{\"text\": \"two\"} trailing\n"
                     "{\"text\": \"three\"}\n");
  TextSourceOptions options;
  options.skip_bad_lines = true;
  TextSourceStats stats;
  std::vector<Doc> docs = read_all({f}, options, &stats);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].text, "one");
  EXPECT_EQ(docs[1].text, "three");
  EXPECT_EQ(docs[1].origin, f.string() + ":7");
  EXPECT_EQ(stats.bad_lines, 5);
  EXPECT_HAS(stats.first_bad_line, f.string() + ":2: not JSON");
}

TEST(Jsonl, SaysWhatIsWrongWithALine) {
  fs::path dir = test_dir();
  struct Case {
    std::string line, words;
  } cases[] = {
      {"{\"body\": \"x\", \"id\": 3}",
       "no key \"text\" (keys: \"body\", \"id\"); choose the field "
       "with --json-key"},
      {"{\"text\": 5}", "key \"text\" holds a number, not a string"},
      {"{\"text\": null}", "key \"text\" holds null, not a string"},
      {"{\"text\": [\"a\"]}", "key \"text\" holds an array, not a string"},
      {"{\"text\": {\"a\": \"b\"}}", "key \"text\" holds an object, not a string"},
      {"[1]", "not a JSON object but an array"},
      {"\"text\"", "not a JSON object but a string"},
      {"{\"text\": \"a\"", "not JSON"},
      {"{\"text\": \"\xff\"}", "not JSON"},  // invalid UTF-8
  };
  for (const Case& c : cases) {
    fs::path f = write(dir / "c.jsonl", "{\"text\": \"fine\"}\n" + c.line + "\n");
    EXPECT_HAS(io_error({f}, {}), f.string() + ":2: " + c.words);
  }
}

TEST(Jsonl, EmptyDocumentsSkippedAndCounted) {
  fs::path f = write(test_dir() / "a.jsonl",
                     "{\"text\": \"\"}\n{\"text\": \" \\n\\t \"}\n{\"text\": \"x\"}\n");
  TextSourceStats stats;
  std::vector<Doc> docs = read_all({f}, {}, &stats);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(stats.empty_documents, 2);
}

TEST(Jsonl, NoDocumentsAtAllIsAnError) {
  fs::path f = write(test_dir() / "a.jsonl", "{\"text\": \"\"}\n\n");
  std::string e = io_error({f}, {});
  EXPECT_HAS(e, "no documents in " + f.string());
  EXPECT_HAS(e, "1 empty documents");
  fs::path empty = write(test_dir() / "e.jsonl", "");
  EXPECT_HAS(io_error({empty}, {}), "no documents");
}

// ---- Plain text -----------------------------------------------------------------------

TEST(Text, Modes) {
  fs::path f = write(test_dir() / "a.txt", "para one\nstill one\n\n \n\npara two\r\n\nthree\n");
  TextSourceOptions options;
  std::vector<Doc> docs = read_all({f}, options);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "para one\nstill one\n\n \n\npara two\r\n\nthree\n");
  EXPECT_EQ(docs[0].origin, f.string());

  options.txt_mode = TxtMode::kParagraph;
  docs = read_all({f}, options);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "para one\nstill one");
  EXPECT_EQ(docs[0].origin, f.string() + ":1");
  EXPECT_EQ(docs[1].text, "para two");
  EXPECT_EQ(docs[1].origin, f.string() + ":6");
  EXPECT_EQ(docs[2].text, "three");
  EXPECT_EQ(docs[2].origin, f.string() + ":8");

  options.txt_mode = TxtMode::kLine;
  TextSourceStats stats;
  docs = read_all({f}, options, &stats);
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[1].text, "still one");
  EXPECT_EQ(docs[2].text, "para two");
  EXPECT_EQ(docs[2].origin, f.string() + ":6");
  EXPECT_EQ(stats.empty_documents, 4);  // lines 3, 4, 5 and 7
}

TEST(Text, ParseTxtMode) {
  EXPECT_EQ(parse_txt_mode("file"), TxtMode::kFile);
  EXPECT_EQ(parse_txt_mode("line"), TxtMode::kLine);
  EXPECT_EQ(parse_txt_mode("paragraph"), TxtMode::kParagraph);
  EXPECT_THROW(parse_txt_mode("lines"), loom::Error);
}

// ---- Inputs and directories ------------------------------------------------------------

TEST(Inputs, DirectoriesWalkedInSortedOrder) {
  fs::path dir = test_dir();
  write(dir / "b.txt", "B");
  write(dir / "a" / "z.jsonl", "{\"text\": \"AZ\"}\n");
  write(dir / "a" / "b.html", "<p>AB</p>");
  write(dir / "a" / "c" / "d.md", "ACD");
  write(dir / "A.TXT", "upper");
  write(dir / ".hidden" / "x.txt", "hidden");
  write(dir / ".dot.txt", "hidden");
  write(dir / "c.bin", "ignored");
  write(dir / "d.txt", "");  // empty: skipped
  TextSourceStats stats;
  std::vector<Doc> docs = read_all({dir}, {}, &stats);
  std::vector<std::string> texts;
  for (const Doc& d : docs) texts.push_back(d.text);
  EXPECT_EQ(texts, (std::vector<std::string>{"upper", "AB", "ACD", "AZ", "B"}));
  EXPECT_EQ(stats.files, 6);
  EXPECT_EQ(stats.empty_documents, 1);

  TextSourceOptions only_html;
  only_html.extensions = {".html"};
  docs = read_all({dir, dir / "b.txt"}, only_html);  // explicit files are taken regardless
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].text, "AB");
  EXPECT_EQ(docs[0].origin, (dir / "a" / "b.html").string());
  EXPECT_EQ(docs[1].text, "B");
}

TEST(Inputs, CleanErrors) {
  fs::path dir = test_dir();
  EXPECT_HAS(io_error({dir / "missing.jsonl"}, {}), "missing.jsonl: no such file or directory");
  fs::create_directories(dir / "empty");
  write(dir / "empty" / "x.csv", "a,b");
  EXPECT_HAS(io_error({dir / "empty"}, {}), "no input files in this directory");
  try {
    read_all({write(dir / "x.csv", "a")}, {});
    ADD_FAILURE();
  } catch (const loom::Error& e) {
    EXPECT_HAS(e.what(), "x.csv: unknown input kind");
  }
  EXPECT_THROW(read_all({}, {}), loom::Error);
  EXPECT_EQ(input_kind("a/b.JSONL"), InputKind::kJsonl);
  EXPECT_EQ(input_kind("x.rst.txt"), InputKind::kText);
  EXPECT_EQ(input_kind("x.htm"), InputKind::kHtml);
  EXPECT_FALSE(input_kind("x.gz").has_value());
}

TEST(Inputs, UnreadableFile) {
  fs::path f = write(test_dir() / "secret.txt", "x");
  fs::permissions(f, fs::perms::none);
  if (::geteuid() != 0) {
    EXPECT_HAS(io_error({f}, {}), "secret.txt: cannot open");
    return;
  }
  // Root reads everything (CI runs as root): the read runs in a child that has given up root
  // for the unprivileged user 65534 ("nobody"), who may not read the file. The file lies in
  // a directory that user may enter (the test directory is under root's home).
  char dir_name[] = "/tmp/loom_unreadable_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_name), nullptr);
  fs::path dir = dir_name;
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  f = write(dir / "secret.txt", "x");
  fs::permissions(f, fs::perms::none);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};
  pid_t child = ::fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    try {
      read_all({f}, {});
      ::_exit(1);  // read a file it may not read
    } catch (const IoError& e) {
      if (std::string(e.what()).find("secret.txt: cannot open") != std::string::npos) ::_exit(0);
      std::fprintf(stderr, "the error as user 65534: %s\n", e.what());
      ::_exit(2);
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died (status " << status << ")";
  int code = WEXITSTATUS(status);
  if (code == 3) GTEST_SKIP() << "cannot drop root (setuid 65534 refused) to test an unreadable file";
  EXPECT_EQ(code, 0) << (code == 1   ? "user 65534 read a file with no permissions"
                         : code == 2 ? "the error does not say 'secret.txt: cannot open'"
                                     : "not an IoError");
}

TEST(Inputs, RawAndExtractHalves) {
  fs::path f = write(test_dir() / "a.jsonl", "{\"text\": \"x\"}\nbad\n");
  std::vector<fs::path> files = list_input_files({f}, {});
  std::vector<RawDocument> raws;
  TextSourceStats stats;
  read_raw_documents(
      files, {}, [&](RawDocument&& r) { raws.push_back(std::move(r)); }, &stats);
  ASSERT_EQ(raws.size(), 2u);
  std::string scratch, error;
  EXPECT_EQ(extract_text(raws[0], {}, scratch, &error), std::optional<std::string_view>("x"));
  EXPECT_FALSE(extract_text(raws[1], {}, scratch, &error).has_value());
  EXPECT_HAS(error, f.string() + ":2: not JSON");
}

// ---- HTML ------------------------------------------------------------------------------

TEST(Html, Entities) {
  EXPECT_EQ(html_to_text("a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&#39; &#x41;&#66;"),
            "a & b <c> \"d\" 'e' AB");
  EXPECT_EQ(html_to_text("&mdash;&ndash;&hellip;&lsquo;&rsquo;&ldquo;&rdquo;&copy;&para;&times;"),
            "\u2014\u2013\u2026\u2018\u2019\u201c\u201d\u00a9\u00b6\u00d7");
  EXPECT_EQ(html_to_text("&eacute;&szlig;&alpha;&Omega;&euro;&rarr;&#x1F600;"),
            "\u00e9\u00df\u03b1\u03a9\u20ac\u2192\U0001F600");
  // Unknown, unterminated and invalid ones stay as written; bad code points become U+FFFD.
  EXPECT_EQ(html_to_text("&bogus; &amp &#xZZ; AT&T &#0; &#xD800;"),
            "&bogus; &amp &#xZZ; AT&T \ufffd \ufffd");
  // Non-breaking spaces are spaces.
  EXPECT_EQ(html_to_text("a&nbsp;&nbsp;b&#160;c\u00a0d"), "a b c d");
  EXPECT_EQ(decode_html_entities("&nbsp;"), "\u00a0");
}

TEST(Html, DropsScriptsStylesHeadAndComments) {
  EXPECT_EQ(html_to_text("<html><head><title>T</title><style>p {color: red}</style></head>"
                         "<body><script>var x = '<p>no</p>';</script>"
                         "<!-- a <p>comment</p> -->Hello <SCRIPT type=x>1 < 2</SCRIPT>world"
                         "<noscript>enable js</noscript></body></html>"),
            "Hello world");
  EXPECT_EQ(html_to_text("<!DOCTYPE html><?xml version=\"1.0\"?>x<svg><text>s</text></svg>y"),
            "xy");
}

TEST(Html, BlockTagsAndWhitespace) {
  EXPECT_EQ(html_to_text("<h1>Title</h1><p>One\n  two\tthree</p><p>Four<br>five</p>"
                         "<ul><li>a</li><li>b</li></ul><div>c</div><div>d</div>"),
            "Title\n\nOne two three\n\nFour\nfive\n\na\nb\n\nc\nd");
  // Inline tags neither add nor remove spaces.
  EXPECT_EQ(html_to_text("<p>in<b>line</b> <i>tags</i></p>"), "inline tags");
  EXPECT_EQ(html_to_text("<table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr>"
                         "</table>"),
            "k v\n1 2");
  EXPECT_EQ(html_to_text("<dl><dt>term</dt><dd>meaning</dd></dl>"), "term\nmeaning");
  EXPECT_EQ(html_to_text("   \n <p>  </p> "), "");
  EXPECT_EQ(html_to_text("a < b and c <3"), "a < b and c <3");
  EXPECT_EQ(html_to_text("<a href='x>y' title=\"p>q\">link</a>"), "link");
  EXPECT_EQ(html_to_text("unterminated <p class=\"x"), "unterminated");
}

TEST(Html, PreKeepsWhitespace) {
  EXPECT_EQ(html_to_text("<p>Code:</p><pre>\nint  main() {\n  return 0;&nbsp;}\n</pre><p>after  "
                         "it</p>"),
            "Code:\n\nint  main() {\n  return 0; }\n\nafter it");
  EXPECT_EQ(html_to_text("<pre><span class=\"gp\">&gt;&gt;&gt; </span>x  =  1\n"
                         "<span>y</span>\n</pre>"),
            ">>> x  =  1\ny");
}

TEST(Html, SphinxMainContentOnly) {
  std::string page =
      "<html><head><title>json</title></head><body>"
      "<div class=\"related\" role=\"navigation\"><ul><li>index</li></ul></div>"
      "<div class=\"document\"><div class=\"documentwrapper\"><div class=\"bodywrapper\">"
      "<div class=\"body\" role=\"main\">"
      "<section><h1>json<a class=\"headerlink\" href=\"#m\" title=\"Permalink\">\u00b6</a></h1>"
      "<div class=\"admonition\"><p>Warning</p></div><p>Body text.</p></section>"
      "</div></div></div>"
      "<div class=\"sphinxsidebar\" role=\"navigation\"><p>Quick search</p></div></div>"
      "<div class=\"footer\">&copy; Copyright</div></body></html>";
  EXPECT_EQ(html_to_text(page), "json\n\nWarning\n\nBody text.");
  // Without role="main", a <main> element; without either, the whole page.
  EXPECT_EQ(html_to_text("<nav>menu</nav><main><p>m</p></main><footer>f</footer>"), "m");
  EXPECT_EQ(html_to_text("<nav>menu</nav><p>m</p>"), "menu\n\nm");
}

TEST(Html, RealSphinxPage) {
  // Debian's python3-doc, when installed: a real Sphinx page reduces to its article.
  const fs::path page = "/usr/share/doc/python3.11/html/library/json.html";
  if (!fs::exists(page)) GTEST_SKIP() << page << " is not installed (Debian python3-doc)";
  std::ifstream in(page, std::ios::binary);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string text = html_to_text(html);
  EXPECT_EQ(text.rfind("json \u2014 JSON encoder and decoder\n\nSource code: ", 0), 0u)
      << text.substr(0, 200);
  EXPECT_HAS(text, ">>> import json\n>>> json.dumps(['foo', {'bar': ('baz', None, 1.0, 2)}])");
  for (const char* absent : {"<span", "<div", "</", "Quick search", "\u00b6", "&gt;", "&#39;",
                             "Navigation", "Copyright"})
    EXPECT_EQ(text.find(absent), std::string::npos) << absent;
}

}  // namespace
}  // namespace loom::core
