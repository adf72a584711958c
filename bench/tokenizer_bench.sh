#!/usr/bin/env bash
# GPT-2 BPE tokenization speed: `longhaul-worker prepare-data --tokenizer gpt2` against Hugging
# Face's `tokenizers` (Rust) on the same text and the same vocab.json/merges.txt.
#
#   bench/tokenizer_bench.sh [--worker PATH] [--vocab-size N] [--copies K]
#
# Trains a byte-level BPE vocabulary of --vocab-size tokens (default 8192) with `tokenizers` on the
# demo corpus (worker/data/corpus, 1.6 MB of English prose and docs), writes K copies (default 8)
# of the corpus as K documents, then times prepare-data (one thread, including reading and
# writing shards) and tokenizers' encode of the same K documents (single-threaded, Python
# calls one document at a time; RAYON_NUM_THREADS=1). Checks that both give the same ids and
# prints MB/s. Needs the test venv (scripts/setup-venv.sh) and a built longhaul-worker.
set -euo pipefail
cd "$(dirname "$0")/.."
worker=build/ci/worker/cli/longhaul-worker vocab_size=8192 copies=8
while [[ $# -gt 0 ]]; do
  case "$1" in
    --worker) worker="$2"; shift 2 ;;
    --vocab-size) vocab_size="$2"; shift 2 ;;
    --copies) copies="$2"; shift 2 ;;
    *) echo "usage: $0 [--worker PATH] [--vocab-size N] [--copies K]" >&2; exit 2 ;;
  esac
done
venv="${LONGHAUL_VENV:-.venv}"
work="$(mktemp -d /tmp/lh-tokbench-XXXXXX)"
trap 'rm -rf "$work"' EXIT
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$venv/bin/python" - "$worker" "$vocab_size" "$copies" "$work" <<'PY'
import glob, os, subprocess, sys, time
import numpy as np
from tokenizers import ByteLevelBPETokenizer
worker, vocab_size, copies, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
text = "".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob("worker/data/corpus/*.txt")))
bpe = ByteLevelBPETokenizer()
bpe.train_from_iterator([text], vocab_size=vocab_size, show_progress=False, special_tokens=["<|endoftext|>"])
bpe.save_model(work)
docs = []
for k in range(copies):
    path = os.path.join(work, f"doc{k}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    docs.append(path)
mb = copies * len(text.encode()) / 1e6
cmd = [worker, "prepare-data", "--tokenizer", "gpt2", "--vocab", f"{work}/vocab.json", "--merges",
       f"{work}/merges.txt", "--output-dir", f"{work}/out", "--val-fraction", "0"]
for d in docs:
    cmd += ["--input", d]
t = time.perf_counter()
subprocess.run(cmd, check=True, capture_output=True)
ours = time.perf_counter() - t
ref = ByteLevelBPETokenizer(f"{work}/vocab.json", f"{work}/merges.txt")
ref.add_special_tokens(["<|endoftext|>"])
eot = ref.token_to_id("<|endoftext|>")
t = time.perf_counter()
expected = []
for _ in range(copies):
    expected += [eot] + ref.encode(text).ids
theirs = time.perf_counter() - t
got = np.fromfile(f"{work}/out/train_000000.bin", dtype="<u2", offset=1024).tolist()
same = "yes" if got == expected else "NO"
print(f"== GPT-2 BPE, vocab {vocab_size}, {copies} x {len(text.encode())/1e6:.2f} MB of text, one thread")
print(f"{'tokenizer':40s} {'seconds':>8s} {'MB/s':>8s} {'tokens':>10s}")
print(f"{'longhaul prepare-data (incl. file I/O)':40s} {ours:8.2f} {mb/ours:8.2f} {len(got):10d}")
print(f"{'HF tokenizers ByteLevelBPE encode':40s} {theirs:8.2f} {mb/theirs:8.2f} {len(expected):10d}")
print(f"same ids: {same}")
PY
