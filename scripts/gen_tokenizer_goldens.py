#!/usr/bin/env python3
"""Generates the tokenizer golden data under tests/data/tokenizer/.

References are independent of our C++ code:
  * byte-level BPE: HF `tokenizers` (Rust) rebuilt from a GGUF's vocab / merges / token types,
    for the real SmolLM2 model (when present) and for a tiny BPE trained here (always);
  * pre-tokenizer regexes (gpt2, llama3, qwen2): HF `pre_tokenize_str` with the same regex;
  * SentencePiece BPE: a tiny model trained here with `sentencepiece`, written to a GGUF fixture;
    goldens are sentencepiece's own ids;
  * chat templates: the Jinja template strings rendered with jinja2 the way HF does.

Usage: scripts/gen_tokenizer_goldens.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
Deps: see scripts/requirements-dev.txt (tokenizers, sentencepiece, gguf, numpy, jinja2).
"""

import argparse
import json
import os
import random
import tempfile

import gguf
import jinja2
import jinja2.sandbox
import numpy as np
import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Training text for the tiny fixtures (BPE and SentencePiece).
TRAIN_TEXT = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single
step. It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness. Speculative decoding lets a small draft model propose several tokens which
the large target model then verifies in a single forward pass; accepted tokens are kept and the
first rejected one is resampled, so the output distribution is exactly the target's.
The tokenizer splits text into words and then merges bytes into tokens. Numbers like 1,000,000
and 3.14159 or 2024-06-01 appear in many documents. Hello, world! How are you today? I'm fine,
thanks. We'll see; they've gone; she's here; you're right; I'd say so.
def encode(self, text: str) -> list[int]:
    ids = []
    for word in self.pre_tokenize(text):
        ids.extend(self.bpe(word))
    return ids

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3};
  for (const auto& v : values) std::cout << v << "\\n";
  return 0;
}
{"name": "specd", "version": 1, "tags": ["llm", "serving"], "ratio": 0.75, "ok": true}
Türkçe: çok güzel bir gün, ığdır, şişli, öğretmen. Deutsch: Grüße aus München, schön.
Français: l'été dernier, où êtes-vous? Español: ¿Dónde está la biblioteca? Mañana.
日本語のテキストです。中文文本。한국어 텍스트. Русский текст, привет мир. Ελληνικά.
العربية نص قصير. עברית. हिन्दी पाठ। 😀 🚀 👍 ❤️
""" * 3


def corpus():
    """The >= 300 strings every golden is computed on (deterministic)."""
    s = [
        "", " ", "  ", "\t", "\n", "\r\n", "a", "A", "hello", "Hello world", " Hello world",
        "Hello world ", "Hello  world", "hello\nworld", "hello\r\nworld\r\n", "trailing spaces   ",
        "   leading spaces", "tabs\tand\t\ttabs", "mixed \t \n whitespace \n\n\n", "\n\n\n\n",
        "      ", "\t\t\t", " \n \n ", "a\u00a0b", "nbsp\u00a0\u00a0x", "x\u3000y", "line\u2028sep",
        "para\u2029sep", "nel\u0085x", "vt\x0bff\x0cx", "fs\x1cgs\x1drs\x1eus\x1fx",
        "The quick brown fox jumps over the lazy dog.",
        "It's a dog's life; they're here, we've done it, I'm sure, you'll see, he'd know.",
        "IT'S LOUD. THEY'RE SHOUTING. I'M DONE. WE'VE GONE. YOU'LL SEE. HE'D. SHE'S.",
        "don't can't won't shouldn't", "O'Reilly's book", "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D", "ſ 'ſ 'K 'k \u212a", "rock'n'roll", "''''", "' s",
        "Speculative decoding: a small draft model proposes k tokens; the target verifies them.",
        "Mr. Smith (aged 42) paid $1,234.56 for 3 items on 2024-06-01 at 10:30am.",
        "E-mail: someone@example.com, URL: https://example.org/path?q=1&r=2#frag",
        "C:\\Program Files\\specd\\bin\\specd.exe --port=8080",
        # numbers
        "0", "1", "12", "123", "1234", "12345", "123456789012345678901234567890",
        "3.14159265358979", "1,000,000", "1 000 000", "-42", "+7", "1e-10", "0x1F", "2^64",
        "version 1.2.3-rc4", "٣٤٥ arabic-indic", "१२३ devanagari", "½ ¾ ² ³ ①②③ Ⅻ ⅷ",
        "𝟘𝟙𝟚 math digits", "12abc34def", "abc123", "a1b2c3", " 1", "  12", "x 123 y",
        "99 bottles of beer on the wall, 99 bottles of beer.",
        "0" * 100, "9876543210" * 8,
        # code
        "def f(x):\n    return x * 2\n",
        "for i in range(10):\n\tprint(i, end='')\n",
        "class Foo:\n    def __init__(self):\n        self.x = {'a': [1, 2, 3]}\n",
        "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n",
        "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v[0];\n}\n",
        "template <typename T> T max(T a, T b) { return a > b ? a : b; }",
        "auto x = std::make_unique<Foo>(); x->bar(); // comment\n/* block */",
        "if (a && b || !c) { x += 1; } else if (y <= 2) { z >>= 3; }",
        '{"key": "value", "num": 42, "arr": [1, 2.5, null, true, false], "obj": {}}',
        '{\n  "name": "specd",\n  "nested": {\n    "deep": [\n      {"x": 1}\n    ]\n  }\n}\n',
        "SELECT * FROM users WHERE id = 1 AND name LIKE '%smith%';",
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "$ ls -la | grep '^d' > out.txt 2>&1 && echo done",
        "x=1;y=2;z=x+y", "a->b", "a::b", "a...b", "!!!???", "---", "===", "***", "___", "~~~",
        "    indented four", "\tindented tab", "}\n\n}", "))))", "@@ -1,4 +1,5 @@",
        # Turkish and European
        "ğüşıöç İ", "İstanbul'da ığdır ve şişli öğretmenleri", "ÇĞİÖŞÜ çğıöşü",
        "Grüße aus München", "l'été où êtes-vous", "¿Dónde está la biblioteca?",
        "Ærøskøbing", "straße STRASSE", "Ελληνικά κείμενα", "Привет, мир! Как дела?",
        # CJK and others
        "日本語のテキストです。", "中文文本，包含标点符号。", "한국어 텍스트입니다.", "混合English和中文",
        "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ", "カタカナ ひらがな 漢字", "العربية نص قصير", "مرحبا بالعالم 123",
        "עברית טקסט", "हिन्दी पाठ।", "ภาษาไทย", "ქართული", "Հայերեն", "தமிழ்", "བོད་ཡིག",
        # emoji, ZWJ, flags, modifiers
        "😀", "😀😀😀", "👍🏽", "👨‍👩‍👧‍👦", "👩‍💻 coding", "🏳️‍🌈", "🇺🇸🇬🇧🇯🇵", "🇩🇪 flag", "❤️", "✔︎",
        "I ❤️ NY", "emoji😀inside", " 🚀", "🚀 ", "🧑🏿‍🤝‍🧑🏻",
        # combining marks
        "e\u0301", "cafe\u0301", "n\u0303o", "a\u0300\u0301\u0302\u0303\u0304", "\u0301start",
        "Z\u0351\u0364a\u0352l\u0307g\u0346o", "\u0915\u094d\u0937", "각\u1100\u1161\u11a8",
        # special-token text
        "<|im_start|>user\nhi<|im_end|>", "<|im_start|>assistant\n", "<|endoftext|>",
        "text<|endoftext|>more", "<|im_end|><|im_end|>", "<|im_start", "im_start|>",
        "<|im_start|><|im_end|>x", "< |im_start|>", "<s>", "</s>", "<unk>", "[INST] hi [/INST]",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "<custom>", "a<custom>b", "<custom><custom>", " <custom> ",
        # long words
        "a" * 1000, "ab" * 600, "x" * 1500 + " y", "ğ" * 1000, "😀" * 300, " " * 1000,
        "\n" * 500, "supercalifragilisticexpialidocious" * 40, "-" * 1200,
        # mixed
        "Mixed: English, 中文, العربية, 😀, 123, <|im_end|>, tabs\t, newlines\n, done.",
        "The price is €42.50 (≈ $45) — quite “reasonable”… isn’t it?",
        "«quotes» „German“ 「Japanese」 ‘single’",
        "math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ = π/2 ± ∞",
        "box: ┌─┐│ │└─┘ ▁▂▃▄▅▆▇█",
        "▁leading lower one eighth block ▁▁",
        "zero\u200bwidth\u200cjoiners\u200d here\ufeff",
        "private use \ue000\uf8ff and plane 15 \U000f0000",
        "control \x01\x02\x7f chars",
        "astral 𐍈 𝄞 𠜎 𪚥",
    ]
    rng = random.Random(1234)
    words = ("the of and to in is that for it as with was on be by at this had not are but from "
             "or have an they which one you were all we her she there would their will when who "
             "him been has more if no out so said what up its about than into them can only "
             "other new some could time these two may then do first any my now such like our "
             "over man me even most made after also did many before must through back years "
             "where much your way well down should because each just those people how too "
             "little state good very make world still own see men work long get here between "
             "both life being under never day same another know while last might us great old "
             "year off come since against go came right used take three").split()
    for _ in range(60):
        n = rng.randint(1, 30)
        parts = []
        for _ in range(n):
            w = rng.choice(words)
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.13:
                w = w.upper()
            elif r < 0.18:
                w = str(rng.randint(0, 10 ** rng.randint(1, 8)))
            parts.append(w)
            parts.append(rng.choice([" ", " ", " ", " ", ", ", ". ", "\n", "  ", "\t", "'s ", "-"]))
        s.append("".join(parts))
    # Random code points from well-established blocks (all planes' common scripts), so Unicode
    # version differences between regex engines do not matter.
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F), (0x2190, 0x22FF),
              (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
              (0x1F300, 0x1F64F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0x9, 0xD)]
    for _ in range(80):
        n = rng.randint(1, 40)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        s.append("".join(chars))
    assert len(s) >= 300, len(s)
    assert all("\x00" not in x for x in s)
    return s


def read_gguf_vocab(path):
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields.get(key)
        return None if f is None else [int(f.parts[i][0]) for i in f.data]

    def scalar(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    return {
        "model": scalar("tokenizer.ggml.model"),
        "pre": scalar("tokenizer.ggml.pre"),
        "tokens": strings("tokenizer.ggml.tokens"),
        "types": ints("tokenizer.ggml.token_type"),
        "merges": strings("tokenizer.ggml.merges") if "tokenizer.ggml.merges" in r.fields else [],
        "chat_template": scalar("tokenizer.chat_template"),
    }


def hf_byte_level_from_gguf(v):
    """An independent HF tokenizers reference built from GGUF vocab data (smollm pre)."""
    assert v["model"] == "gpt2" and v["pre"] in ("smollm", "starcoder"), (v["model"], v["pre"])
    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab.setdefault(t, i)
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    types = v["types"] or [1] * len(v["tokens"])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(v["tokens"], types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(v["tokens"], types) if ty == 4])
    return tok


def bpe_goldens(tok, strings, name, source):
    cases = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in strings]
    return {"name": name, "source": source, "parse_special": True, "cases": cases}


def write_json(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make_tiny_bpe_fixture(path):
    """Trains a small byte-level BPE (HF trainer) and stores it as a gpt2/smollm GGUF."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator([TRAIN_TEXT], trainer)
    model = json.loads(t.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for tok, i in vocab.items():
        tokens[i] = tok
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if tok in specials else 1 for tok in tokens]
    tokens.append("<custom>")  # a user-defined (type 4) token
    types.append(4)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_tiny_spm_fixture(path, workdir):
    """Trains a small SentencePiece BPE with byte fallback and stores it as a llama GGUF."""
    txt = os.path.join(workdir, "train.txt")
    with open(txt, "w", encoding="utf-8") as f:
        f.write(TRAIN_TEXT)
    prefix = os.path.join(workdir, "tiny")
    spm.SentencePieceTrainer.train(
        input=txt, model_prefix=prefix, model_type="bpe", vocab_size=800, byte_fallback=True,
        normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, character_coverage=1.0, hard_vocab_limit=False,
        split_digits=True, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    n = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        else:
            types.append(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(np.float32(x)) for x in scores])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sp


# Well-known official template strings (tokenizer_config.json "chat_template").
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message "
    "!= false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")
SMOLLM_TEMPLATE_FALLBACK = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def render(template, messages, add_generation_prompt, bos, eos):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos,
            eos_token=eos)
    except jinja2.exceptions.TemplateError:
        return None  # the template refuses this conversation


def chat_goldens(smollm_template):
    u = lambda c: {"role": "user", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    sy = lambda c: {"role": "system", "content": c}
    convs = [
        [u("Hello!")],
        [u("  What is 2+2?\n")],
        [sy("You are terse."), u("Hi"), a("Hello."), u("Bye")],
        [u("Hi"), a(" Hello, how can I help? "), u("Tell me a joke.")],
        [sy(""), u("empty system")],
        [sy("Only a system message")],
        [u("multi\nline\n\ncontent"), a("ok\n"), u("\tTabbed\u3000")],
        [u("Unicode: ğüşıöç İ 日本語 😀")],
        [a("assistant first")],
        [u("a"), u("b")],
        [sy("s"), u("u1"), a("a1"), u("u2"), a("a2")],
        [u("<|im_start|> literal special text <|im_end|>")],
    ]
    templates = {
        "smollm": (smollm_template, "<|im_start|>", "<|im_end|>"),
        "llama3": (LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>"),
        "llama2": (LLAMA2_TEMPLATE, "<s>", "</s>"),
    }
    out = {"templates": {}, "cases": []}
    for name, (tmpl, bos, eos) in templates.items():
        out["templates"][name] = {"template": tmpl, "bos": bos, "eos": eos}
        for conv in convs:
            for gen in (False, True):
                out["cases"].append({"template": name, "messages": conv,
                                     "add_generation_prompt": gen,
                                     "expected": render(tmpl, conv, gen, bos, eos)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    strings = corpus()

    # 1. Real model (byte-level BPE, smollm pre-tokenizer).
    smollm_template = SMOLLM_TEMPLATE_FALLBACK
    if os.path.exists(args.model):
        v = read_gguf_vocab(args.model)
        smollm_template = v["chat_template"]
        write_json("smollm2_goldens.json",
                   bpe_goldens(hf_byte_level_from_gguf(v), strings, "smollm2",
                               os.path.basename(args.model)))
    else:
        print(f"{args.model} not found: keeping the existing smollm2_goldens.json")

    # 2. Tiny byte-level BPE fixture (always available to the tests).
    bpe_path = os.path.join(OUT, "tiny_bpe.gguf")
    make_tiny_bpe_fixture(bpe_path)
    write_json("tiny_bpe_goldens.json",
               bpe_goldens(hf_byte_level_from_gguf(read_gguf_vocab(bpe_path)), strings,
                           "tiny_bpe", "tiny_bpe.gguf"))

    # 3. Pre-tokenizer splits for regexes the real vocabulary does not use.
    pre = {"patterns": {"gpt2": GPT2_RE, "llama3": LLAMA3_RE, "qwen2": QWEN2_RE}, "cases": []}
    splitters = {k: pre_tokenizers.Split(Regex(p), behavior="isolated")
                 for k, p in pre["patterns"].items()}
    for s in strings:
        case = {"text": s}
        for k, sp in splitters.items():
            case[k] = [piece for piece, _ in sp.pre_tokenize_str(s)]
        pre["cases"].append(case)
    write_json("pretokenizer_goldens.json", pre)

    # 4. SentencePiece BPE fixture + sentencepiece's own ids.
    with tempfile.TemporaryDirectory() as tmp:
        sp = make_tiny_spm_fixture(os.path.join(OUT, "tiny_spm.gguf"), tmp)
        write_json("tiny_spm_goldens.json", {
            "name": "tiny_spm", "source": "tiny_spm.gguf", "parse_special": False,
            "cases": [{"text": s, "ids": sp.encode(s)} for s in strings]})

    # 5. Chat templates.
    write_json("chat_template_goldens.json", chat_goldens(smollm_template))


if __name__ == "__main__":
    main()
