#!/usr/bin/env python3
"""`prepare-data --tokenizer gpt2` gives the ids of an independent byte-level BPE implementation.

Trains a small byte-level BPE vocabulary (vocab.json + merges.txt, as Hugging Face distributes
GPT-2's) with the `tokenizers` package on a generated multilingual corpus, runs
`longhaul-worker prepare-data --tokenizer gpt2` on test documents, and checks that the shard
holds exactly `[<|endoftext|>] + tokenizers.encode(doc)` for every document (llm.c's layout),
on text with unicode letters and numbers, whitespace runs, digits, contractions, emoji,
invalid-looking punctuation and a literal <|endoftext|>; that the ids decode back to the text;
that the manifest names the tokenizer; and that a garbled merges.txt is exit 2 with nothing
written.

Usage: python tokenizer_test.py --worker build/.../longhaul-worker   (prints "PASS ..." or fails)
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
from tokenizers import ByteLevelBPETokenizer

EOT = "<|endoftext|>"
WORDS = ["the", "The", "cat", "sat", "on", "mat", "naïve", "café", "Ärger", "straße", "日本語",
         "中文", "текст", "λόγος", "عربى", "123", "4.56", "1,000", "x2", "²³", "Ⅻ", "🙂", "🚀🚀",
         "don't", "I'm", "they'll", "we've", "you're", "it's", "O'Neil", "DON'T", "e-mail",
         "(quoted)", "\"q\"", "#tag", "@user", "...", "—", "\t", "\n", "\n\n", "   ", "\u3000",
         "\u00a0", "a\u200bb"]


def random_text(rng, n):
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice([" ", " ", " ", "  ", "\n", "", ", ", ". "]))
    return "".join(parts)


def check(condition, message):
    if not condition:
        print("FAIL: " + message, file=sys.stderr)
        sys.exit(1)


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    check(header[0] == 20240520 and header[1] == 1, f"{path}: bad shard header {header[:3]}")
    tokens = np.fromfile(path, dtype="<u2", offset=1024)
    check(len(tokens) == header[2], f"{path}: header says {header[2]} tokens, file has {len(tokens)}")
    return tokens.tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    rng = random.Random(1234)
    with tempfile.TemporaryDirectory(prefix="lh-tokenizer-") as work:
        # 1. A small BPE vocabulary made here (all 256 byte symbols + merges + <|endoftext|>).
        trainer = ByteLevelBPETokenizer()
        corpus = [random_text(rng, 200) for _ in range(300)]
        trainer.train_from_iterator(corpus, vocab_size=700, min_frequency=2, show_progress=False,
                                    special_tokens=[EOT])
        trainer.save_model(work)
        vocab, merges = os.path.join(work, "vocab.json"), os.path.join(work, "merges.txt")
        with open(merges, encoding="utf-8") as f:
            n_merges = sum(1 for line in f if line.strip() and not line.startswith("#version"))
        check(n_merges > 200, f"the trained vocabulary has only {n_merges} merges")

        # 2. The independent implementation, loaded from the same files.
        reference = ByteLevelBPETokenizer(vocab, merges)
        reference.add_special_tokens([EOT])
        eot = reference.token_to_id(EOT)

        docs = [random_text(rng, 150) for _ in range(12)]
        docs += ["Hello world! It's 2024; we'll see.\n\n\n  Indented\tline   \n",
                 "   leading spaces and trailing   ",
                 f"two stories{EOT}in one file",
                 "digits 1234567890 0.5 ½ ٣ and emoji 🙂🙂 👩‍👩‍👧",
                 "'s 're 've 'm 'll 'd 'x ''' \"\" 's"]
        inputs = []
        for i, doc in enumerate(docs):
            path = os.path.join(work, f"doc{i:02d}.txt")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(doc)
            inputs.append(path)
        out = os.path.join(work, "shards")
        cmd = [args.worker, "prepare-data", "--tokenizer", "gpt2", "--vocab", vocab, "--merges",
               merges, "--output-dir", out, "--val-fraction", "0"]
        for p in inputs:
            cmd += ["--input", p]
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 0, f"prepare-data failed ({r.returncode}): {r.stdout}{r.stderr}")

        # 3. Same ids, document by document.
        got = read_shard(os.path.join(out, "train_000000.bin"))
        expected = []
        for doc in docs:
            expected += [eot] + reference.encode(doc).ids
        if got != expected:
            pos = next(i for i, (a, b) in enumerate(zip(got + [None], expected + [None])) if a != b)
            check(False, f"ids differ at {pos}: longhaul {got[pos:pos + 8]} vs tokenizers "
                         f"{expected[pos:pos + 8]} (lengths {len(got)} vs {len(expected)})")
        text = reference.decode(got, skip_special_tokens=False)
        check(text == "".join(EOT + d for d in docs), "the ids do not decode to the documents")

        with open(os.path.join(out, "longhaul-data.json")) as f:
            manifest = json.load(f)
        check(manifest["tokenizer"] == "gpt2" and manifest["vocab_size"] == reference.get_vocab_size()
              and manifest["end_of_text"] == eot, f"manifest {manifest}")
        check(os.path.exists(os.path.join(out, manifest["vocab"])) and
              os.path.exists(os.path.join(out, manifest["merges"])), "tokenizer files not copied")

        # 4. A garbled merges.txt: exit 2 naming the file and line, nothing written.
        bad = os.path.join(work, "bad-merges.txt")
        with open(bad, "w") as f:
            f.write("#version: 0.2\nq z z\n")
        out2 = os.path.join(work, "shards2")
        r = subprocess.run([args.worker, "prepare-data", "--tokenizer", "gpt2", "--vocab", vocab,
                            "--merges", bad, "--input", inputs[0], "--output-dir", out2],
                           capture_output=True, text=True)
        check(r.returncode == 2 and "bad-merges.txt:2" in r.stderr + r.stdout,
              f"garbled merges: exit {r.returncode}, {r.stderr}{r.stdout}")
        check(not os.path.exists(out2) or not os.listdir(out2), "shards written for bad input")
        print(f"PASS tokenizer_test: {len(expected)} ids of {len(docs)} documents equal "
              f"tokenizers {reference.get_vocab_size()}-token byte-level BPE ({n_merges} merges)")


if __name__ == "__main__":
    main()
