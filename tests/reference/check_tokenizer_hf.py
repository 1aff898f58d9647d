"""loom's byte-level BPE against Hugging Face `tokenizers` (the ids and decoded text must match).

usage: check_tokenizer_hf.py LOOM WORKDIR

(a) Trains a ByteLevel BPE with `tokenizers` on a generated corpus, saves it as tokenizer.json
    (GPT-2 pre-tokeniser, with and without add_prefix_space; Llama-3 pre-tokeniser with
    ignore_merges; merges as strings and as pairs; added tokens, lstrip/rstrip) and as
    vocab.json + merges.txt, and compares `loom tokenizer encode/decode` with `tokenizers` on a
    test set of awkward text and on every Unicode code point.
(b) Trains with `loom tokenizer train`, loads loom's vocab.json + merges.txt into `tokenizers`
    and compares again.
"""
import json
import os
import random
import subprocess
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

LOOM, WORK = sys.argv[1], sys.argv[2]
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
failures = []

# Hand-picked text: white-space runs, contractions, digits, punctuation, scripts, emoji.
SAMPLES = [
    "", " ", "  ", "\t", "\n", "\r\n", "a", "hello world", "Hello, World!", "  leading spaces",
    "trailing spaces   ", "trailing tab\t", "\t\tfoo", " \tfoo", "\t foo", "a  b", "a   b",
    "a \t b",
    "x\r\ny", "line one\nline two\n\nline four\n", "windows\r\nlines\r\n\r\n", "\n\n\nx",
    "  \n  x", "a \r\n\r\n b", "don't", "I'm", "you're", "we've", "she'll", "he'd", "it's", "IT'S",
    "It'S", "DON'T", "'s'", "''s", "x.'s", "rock'n'roll", "'ll'd'm", "'ſx", "'LL", "O'Neil's",
    "12345", "3.14159", "1,000,000", " 42", "x2y3", "١٢٣ ٤٥٦", "Ⅻ ½ ²", "100%", "$5.00",
    "!!!", "...", "?!", "a--b", "foo@bar.com", "https://example.com/a?b=c&d=e", "<html>",
    "def f(x):\n    return x ** 2\n", "if (a && b) { c++; }", "#include <stdio.h>",
    "naïve café résumé", "Ångström", "Straße", "ÀÉÎÕÜ", "e\u0301",
    "a\u0300\u0301\u0302b", "日本語のテキスト", "中文文本，标点。", "한국어 텍스트",
    "Привет, мир!", "Ελληνικά", "مرحبا بالعالم", "שלום עולם", "हिन्दी", "ไทย", "😀",
    "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈",
    "a😀b", " 😀 ", "\u00a0non-breaking\u00a0space", "ideographic\u3000space", "em\u2003space",
    "line\u2028separator", "zero\u200bwidth", "\u0085next line", "\x0bvertical\x0cform",
    "\x00\x01\x02 control \x7f", "tab\tseparated\tvalues", "mixed 123abc 😀 日本 ok's",
    "<|endoftext|>", "hello<|endoftext|>world", "hello <|endoftext|> world",
    "a<|endoftext|><|endoftext|>b", "<|endoftext", "<|im_start|>user\nhi<|im_end|>",
    "x <mask> y", "x<mask>y", " <mask>  z", "\t<mask>\t", "<mask><mask>", "<|endoftext|> <mask>",
]

WORDS = ("the of and to in is was for on that with as by at from his it an were are which this "
         "be or has had not but first one their its new after who they two her she been other "
         "when there all during into school time may years more most only over city some world "
         "would where later up such used many can state about national out known university "
         "united then made").split()


def random_text(rng, n):
    """Generated prose with numbers, punctuation and other scripts, for training."""
    out = []
    extras = ["日本語", "Привет", "naïve", "😀", "'s", "n't", "3.14", "2024", "\n", "\n\n",
              "\t", "  ", "(", ")", ",", ".", "!", "?", ":", "--", "Straße", "مرحبا",
              "<|endoftext|>"]
    for _ in range(n):
        w = rng.choice(WORDS) if rng.random() < 0.8 else rng.choice(extras)
        if rng.random() < 0.1:
            w = w.capitalize()
        out.append(w)
    return " ".join(out)


def random_strings(rng, count):
    """Random strings over an alphabet of awkward characters."""
    alphabet = (list("aZ09 \t\n\r'sStTmMdDlLrRvVeE.,!?-_/\\\"") + ["'s", "'S", "'ll", "'ve", " ",
                "  ", "\r\n", "é", "ß", "日", "本", "😀", "👍🏽", "\u200d", "\u0301", "٣", "½",
                "\u00a0",
                "\u3000", "\u2028", "ſ", "<|endoftext|>", "<mask>", "<|im_start|>", "ℌ", "Ⅻ"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def all_code_points(rng):
    """Every code point of planes 0-3 and 14 (no surrogates) and a sample of the unassigned and
    private planes 4-13, 15, 16, shuffled, in strings of 4096 characters: a check of loom's
    Unicode tables (tools/unicode) against the Oniguruma inside tokenizers."""
    cps = [cp for cp in range(1, 0x110000)
           if not 0xD800 <= cp <= 0xDFFF
           and (cp < 0x40000 or 0xE0000 <= cp < 0xF0000 or cp % 61 == 0)]
    rng.shuffle(cps)
    return ["".join(map(chr, cps[i:i + 4096])) for i in range(0, len(cps), 4096)]


def byte_level(text):
    """GPT-2's bytes_to_unicode applied to the UTF-8 bytes of `text`."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, map(chr, cs)))
    return "".join(table[b] for b in text.encode("utf-8"))


def run(args):
    r = subprocess.run([LOOM] + args, capture_output=True)
    if r.returncode != 0:
        sys.exit("loom %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr.decode()))
    return r.stdout.decode()


def loom_encode(path, texts):
    src = os.path.join(WORK, "texts.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    out = run(["tokenizer", "encode", "--tokenizer", path, "--file", src, "--jsonl"])
    return [json.loads(line) for line in out.split("\n") if line]


def loom_decode(path, id_lists):
    src = os.path.join(WORK, "ids.jsonl")
    with open(src, "w") as f:
        for ids in id_lists:
            f.write(json.dumps(ids) + "\n")
    out = run(["tokenizer", "decode", "--tokenizer", path, "--jsonl", src])
    return [json.loads(line)["text"] for line in out.split("\n") if line]


def compare(name, loom_path, hf, texts, check_decode=True, round_trip=True):
    got = loom_encode(loom_path, texts)
    want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    assert len(got) == len(texts), (name, len(got), len(texts))
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    for i in bad[:5]:
        t = texts[i]
        failures.append("%s: encode %r\n  loom %s\n  hf   %s\n  hf tokens %s" % (
            name, t[:200], got[i][:40], want[i][:40],
            hf.encode(t, add_special_tokens=False).tokens[:40]))
    if bad:
        failures.append("%s: %d of %d texts encode differently" % (name, len(bad), len(texts)))
    if check_decode:
        decoded = loom_decode(loom_path, want)
        for t, ids, d in zip(texts, want, decoded):
            hf_text = hf.decode(ids, skip_special_tokens=False)
            if d != hf_text:
                failures.append("%s: decode of %r: loom %r, hf %r"
                                % (name, t[:100], d[:100], hf_text[:100]))
                break
            # <mask> swallows the white space around it (lstrip, rstrip), as in tokenizers.
            if round_trip and d != t and "<mask>" not in t:
                failures.append("%s: decode(encode(%r)) = %r" % (name, t[:100], d[:100]))
                break
    print("%-44s %5d texts, %7d tokens: %s" % (name, len(texts), sum(map(len, want)),
                                               "ok" if not bad else "%d differ" % len(bad)))


def save_json(j, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return path


def main():
    rng = random.Random(1234)
    corpus = [random_text(rng, 400) for _ in range(200)] + SAMPLES * 3
    # Text that is not in the training corpus too (words that no merge sequence makes).
    texts = SAMPLES + ["zebra quokka axolotl", " Ökonomie  zebras", "123456 😀 日本語"] + \
        random_strings(rng, 300)
    every = all_code_points(rng)

    # (a) A ByteLevel BPE trained by `tokenizers`.
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    hf.train_from_iterator(corpus, trainer)
    model_dir = os.path.join(WORK, "hf_model")
    os.makedirs(model_dir, exist_ok=True)
    hf.model.save(model_dir)  # vocab.json + merges.txt

    # vocab.json + merges.txt: tokens that no merge makes are special tokens (<|endoftext|>).
    gpt2 = Tokenizer(models.BPE.from_file(os.path.join(model_dir, "vocab.json"),
                                          os.path.join(model_dir, "merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.add_special_tokens(["<|endoftext|>"])
    compare("vocab.json + merges.txt", model_dir, gpt2, texts)
    compare("vocab.json + merges.txt, every code point", os.path.join(model_dir, "vocab.json"),
            gpt2, every, check_decode=False)

    # tokenizer.json with more added tokens: special, and normal ones with lstrip/rstrip.
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    hf.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    base = json.loads(hf.to_str())

    variants = {}
    variants["tokenizer.json (GPT-2, ByteLevel)"] = base
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"]["add_prefix_space"] = True
    variants["tokenizer.json (add_prefix_space)"] = j
    j = json.loads(json.dumps(base))
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    variants["tokenizer.json (merges as strings)"] = j
    j = json.loads(json.dumps(base))
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    variants["tokenizer.json (merges as pairs)"] = j
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    # Whole words that no merge sequence makes: ignore_merges takes them as one token. They
    # go at the end of the model's vocabulary, and the added tokens after them (tokenizers
    # numbers added tokens from the model's vocabulary size on, whatever the file says).
    vocab = j["model"]["vocab"]
    for word in ["zebra", " quokka", " axolotl", " Ökonomie", "   ", "456", " 日本語", "😀"]:
        if byte_level(word) not in vocab:
            vocab[byte_level(word)] = len(vocab)
    next_id = len(vocab)
    for t in j["added_tokens"]:
        if t["content"] not in vocab:
            t["id"] = next_id
            next_id += 1
    j["model"]["ignore_merges"] = True
    variants["tokenizer.json (Llama-3 split, ignore_merges)"] = j
    j = json.loads(json.dumps(j))
    j["model"]["ignore_merges"] = False
    variants["tokenizer.json (Llama-3 split)"] = j
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_PATTERN}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    variants["tokenizer.json (GPT-2 split)"] = j

    for name, j in variants.items():
        path = save_json(j, os.path.join(WORK, name.replace(" ", "_").replace(",", "")
                                         .replace("(", "").replace(")", ""), "tokenizer.json"))
        tok = Tokenizer.from_file(path)
        prefix = "add_prefix_space" in name
        compare(name, path, tok, texts, round_trip=not prefix)
        if name.endswith("ignore_merges)"):
            compare(name + ", every code point", path, tok, every, check_decode=False)

    # (b) Trained by loom, read by `tokenizers`.
    corpus_txt = os.path.join(WORK, "corpus.txt")
    with open(corpus_txt, "w") as f:
        f.write("\n".join(corpus[:150]))
    corpus_jsonl = os.path.join(WORK, "corpus.jsonl")
    with open(corpus_jsonl, "w") as f:
        for doc in corpus[150:]:
            f.write(json.dumps({"text": doc}) + "\n")
    out_dir = os.path.join(WORK, "loom_trained")
    run(["tokenizer", "train", "--vocab-size", "900", "--special-token", "<|endoftext|>",
         "--special-token", "<|pad|>", "--output", out_dir, corpus_txt, corpus_jsonl])
    with open(os.path.join(out_dir, "merges.txt")) as f:
        if f.readline() != "#version: 0.2\n":
            failures.append("loom's merges.txt does not start with '#version: 0.2'")
    with open(os.path.join(out_dir, "vocab.json")) as f:
        vocab = json.load(f)
    if len(vocab) != 900 or sorted(vocab.values()) != list(range(900)):
        failures.append("loom's vocab.json has %d tokens, ids %s.., not 0..899"
                        % (len(vocab), sorted(vocab.values())[:3]))
    trained = Tokenizer(models.BPE.from_file(os.path.join(out_dir, "vocab.json"),
                                             os.path.join(out_dir, "merges.txt")))
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trained.add_special_tokens(["<|endoftext|>", "<|pad|>"])
    if trained.get_vocab_size() != 900:
        failures.append("tokenizers reads %d tokens from loom's files, not 900"
                        % trained.get_vocab_size())
    compare("loom-trained vocab.json + merges.txt", out_dir, trained, texts + corpus[:20])

    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("all match")


if __name__ == "__main__":
    main()
