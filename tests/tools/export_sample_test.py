#!/usr/bin/env python3
"""`export`, `sample` and the training samples, checked with the tools users have.

Makes a small GPT-2 BPE vocabulary with Hugging Face's `tokenizers`, prepares GPT-2-token shards,
trains a small model (evaluating, and so sampling, twice), then checks:
  * TensorBoard's EventAccumulator reads the `samples` text summaries (text plugin, string
    tensor) at each evaluation step;
  * `export --format hf`: config.json has GPT2Config's fields for this model; model.safetensors
    (read with `safetensors`) holds exactly GPT2LMHeadModel's parameter names and shapes (tied
    lm_head not stored, no optimizer state); a numpy GPT-2 forward pass written here, driven
    only by config.json and model.safetensors, gives the loss `longhaul-worker eval` reports on
    the same shard; the tokenizer files load in `tokenizers` and encode as the original;
  * `export --format llmc`: llm.c's header and parameter layout (padded vocabulary rows zero,
    transposed matmul weights), and tokenizer.bin's token bytes;
  * errors: a non-empty output directory (exit 2, untouched) and a corrupt checkpoint (exit 4,
    nothing created);
  * `sample`: the same seed gives the same text; --temperature 0 equals greedy decoding by the
    numpy full-context forward pass.
transformers/torch are not in the test venv (CPU wheels are too large for CI); the numpy
forward pass stands in for GPT2LMHeadModel.

Usage: python export_sample_test.py --worker build/.../longhaul-worker   (prints "PASS ...")
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util
from tokenizers import ByteLevelBPETokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_test import EOT, random_text  # noqa: E402

N_LAYER, N_HEAD, N_EMBD, CTX = 2, 2, 32, 32
B, T = 4, 32


def check(condition, message):
    if not condition:
        print("FAIL: " + message, file=sys.stderr)
        sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def hf_parameter_names(n_layer):
    """GPT2LMHeadModel's state dict without the tied lm_head and the non-persistent buffers."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        for part in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                     "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                     "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]:
            names.append(f"transformer.h.{i}.{part}")
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def forward(cfg, W, ids):
    """GPT-2 (gelu_new, pre-LN, tied head) in float64: ids (b, t) -> logits (b, t, V)."""
    ids = np.asarray(ids)
    b, t = ids.shape
    C, NH = cfg["n_embd"], cfg["n_head"]
    hs = C // NH
    eps = cfg["layer_norm_epsilon"]
    g = lambda n: W["transformer." + n].astype(np.float64)  # noqa: E731

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g(name + ".weight") + g(name + ".bias")

    x = g("wte.weight")[ids] + g("wpe.weight")[:t]
    mask = np.triu(np.ones((t, t), dtype=bool), 1)
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = ln(x, p + "ln_1")
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(b, t, NH, hs).transpose(0, 2, 1, 3)
                   for j in range(3))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
        att[..., mask] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, C)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = ln(x, p + "ln_2")
        f = h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")
        f = 0.5 * f * (1 + np.tanh(np.sqrt(2 / np.pi) * (f + 0.044715 * f ** 3)))
        x = x + f @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    return ln(x, "ln_f") @ g("wte.weight").T


def byte_decoder():
    """GPT-2's bytes_to_unicode(), inverted: vocabulary character -> byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def read_shard(path):
    return np.fromfile(path, dtype="<u2", offset=1024).astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    worker = ap.parse_args().worker
    rng = random.Random(99)
    with tempfile.TemporaryDirectory(prefix="lh-export-") as work:
        # --- a GPT-2 BPE vocabulary, shards, and a short training run ---
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator([random_text(rng, 200) for _ in range(200)], vocab_size=500,
                                min_frequency=2, show_progress=False, special_tokens=[EOT])
        tok_dir = os.path.join(work, "tok")
        os.makedirs(tok_dir)
        bpe.save_model(tok_dir)
        vocab, merges = os.path.join(tok_dir, "vocab.json"), os.path.join(tok_dir, "merges.txt")
        reference = ByteLevelBPETokenizer(vocab, merges)
        reference.add_special_tokens([EOT])
        V = reference.get_vocab_size()
        cmd = [worker, "prepare-data", "--tokenizer", "gpt2", "--vocab", vocab, "--merges", merges,
               "--output-dir", os.path.join(work, "data"), "--val-fraction", "0.2"]
        for i in range(30):
            path = os.path.join(work, f"doc{i}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(random_text(rng, 120))
            cmd += ["--input", path]
        r = run(cmd)
        check(r.returncode == 0, f"prepare-data: {r.stdout}{r.stderr}")
        config = f"""
model: {{preset: tiny, vocab_size: {V}, n_layer: {N_LAYER}, n_head: {N_HEAD}, n_embd: {N_EMBD}, context_length: {CTX}}}
data: {{train: '{work}/data/train_*.bin', val: '{work}/data/val_*.bin'}}
training: {{batch_size: {B}, seq_len: {T}, max_steps: 60, learning_rate: 0.01, warmup_steps: 5}}
checkpoint: {{save_model_secs: 0, save_model_steps: 30}}
summaries: {{every_steps: 5, save_summaries_secs: 0}}
eval: {{every_steps: 30, batches: 2, sample_tokens: 12, sample_prompt: "the cat"}}
device: cpu
"""
        with open(os.path.join(work, "cfg.yaml"), "w") as f:
            f.write(config)
        logdir = os.path.join(work, "run")
        r = run([worker, "train", "--config", "cfg.yaml", "--logdir", logdir], cwd=work)
        check(r.returncode == 0, f"train: {r.returncode} {r.stdout}{r.stderr}")
        sample_lines = [l for l in r.stdout.splitlines() if "| sample: the cat" in l]
        check(len(sample_lines) == 2, f"expected 2 sample log lines:\n{r.stdout}")
        ckpt = os.path.join(logdir, "model.ckpt-60.safetensors")
        check(os.path.exists(os.path.join(logdir, "tokenizer", "vocab.json")),
              "the logdir has no tokenizer/vocab.json")

        # --- TensorBoard reads the text summaries ---
        acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.TENSORS: 0})
        acc.Reload()
        check("samples" in acc.Tags()["tensors"], f"no 'samples' tag: {acc.Tags()}")
        check(acc.SummaryMetadata("samples").plugin_data.plugin_name == "text",
              "the samples are not text-plugin summaries")
        events = acc.Tensors("samples")
        check([e.step for e in events] == [30, 60], f"samples at steps {[e.step for e in events]}")
        for e in events:
            text = tensor_util.make_ndarray(e.tensor_proto).item().decode("utf-8")
            check(text.startswith("    the cat") and len(text) > len("    the cat"),
                  f"sample text {text!r}")

        # --- export --format hf ---
        hf = os.path.join(work, "hf")
        r = run([worker, "export", "--checkpoint", ckpt, "--output", hf])
        check(r.returncode == 0, f"export hf: {r.stdout}{r.stderr}")
        with open(os.path.join(hf, "config.json")) as f:
            cfg = json.load(f)
        expect = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V,
                  "n_positions": CTX, "n_embd": N_EMBD, "n_layer": N_LAYER, "n_head": N_HEAD,
                  "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                  "tie_word_embeddings": True, "bos_token_id": reference.token_to_id(EOT),
                  "eos_token_id": reference.token_to_id(EOT), "torch_dtype": "float32"}
        for key, value in expect.items():
            check(cfg.get(key) == value, f"config.json {key} = {cfg.get(key)!r}, want {value!r}")
        with safe_open(os.path.join(hf, "model.safetensors"), "np") as f:
            check(f.metadata().get("format") == "pt", f"metadata {f.metadata()}")
            names = sorted(f.keys())
            W = {n: f.get_tensor(n) for n in names}
        check(names == sorted(hf_parameter_names(N_LAYER)),
              f"tensor names differ from GPT2LMHeadModel's: {names}")
        check(W["transformer.wte.weight"].shape == (V, N_EMBD) and
              W["transformer.h.0.attn.c_attn.weight"].shape == (N_EMBD, 3 * N_EMBD) and
              W["transformer.h.1.mlp.c_proj.weight"].shape == (4 * N_EMBD, N_EMBD),
              "Conv1D shapes")
        for name in ["generation_config.json", "vocab.json", "merges.txt",
                     "tokenizer_config.json", "special_tokens_map.json"]:
            check(os.path.exists(os.path.join(hf, name)), f"export has no {name}")
        exported_tok = ByteLevelBPETokenizer(os.path.join(hf, "vocab.json"),
                                             os.path.join(hf, "merges.txt"))
        probe = "the cat's naïve café 123 🙂"
        check(exported_tok.encode(probe).ids == reference.encode(probe).ids, "exported tokenizer")

        # The numpy forward pass of the exported model vs `longhaul-worker eval`.
        val = os.path.join(work, "data", "val_000000.bin")
        r = run([worker, "eval", "--checkpoint", ckpt, "--data", val, "--batches", "3", "--json",
                 "--set", f"training.batch_size={B}", "--set", f"training.seq_len={T}"])
        check(r.returncode == 0, f"eval: {r.stdout}{r.stderr}")
        ev = json.loads(r.stdout)
        tokens = read_shard(val)
        losses = []
        for k in range(ev["batches"]):
            chunk = tokens[k * B * T: k * B * T + B * T + 1]
            x, y = chunk[:-1].reshape(B, T), chunk[1:].reshape(B, T)
            logits = forward(cfg, W, x)
            m = logits.max(-1, keepdims=True)
            lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
            losses.append((lse - np.take_along_axis(logits, y[..., None], -1)[..., 0]).mean())
        numpy_loss = float(np.mean(losses))
        check(abs(numpy_loss - ev["mean_loss"]) < 1e-4 * max(1.0, abs(numpy_loss)),
              f"numpy loss of the export {numpy_loss:.6f} != eval {ev['mean_loss']:.6f}")

        # --- export --format llmc ---
        llmc = os.path.join(work, "llmc")
        r = run([worker, "export", "--checkpoint", ckpt, "--output", llmc, "--format", "llmc"])
        check(r.returncode == 0, f"export llmc: {r.stdout}{r.stderr}")
        raw = np.fromfile(os.path.join(llmc, "model.bin"), dtype="<i4", count=256)
        Vp = (V + 127) // 128 * 128
        check(list(raw[:8]) == [20240326, 3, CTX, V, N_LAYER, N_HEAD, N_EMBD, Vp],
              f"llm.c header {raw[:8]}")
        params = np.fromfile(os.path.join(llmc, "model.bin"), dtype="<f4", offset=1024)
        C, L = N_EMBD, N_LAYER
        sizes = [("wte", (Vp, C)), ("wpe", (CTX, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                 ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
                 ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
                 ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
                 ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
        check(params.size == sum(int(np.prod(s)) for _, s in sizes), "llm.c parameter count")
        P, off = {}, 0
        for name, shape in sizes:
            n = int(np.prod(shape))
            P[name] = params[off:off + n].reshape(shape)
            off += n
        h = lambda i, n: W[f"transformer.h.{i}.{n}"]  # noqa: E731
        check(np.array_equal(P["wte"][:V], W["transformer.wte.weight"]) and
              not P["wte"][V:].any(), "wte (padded rows must be zero)")
        for i in range(L):
            check(np.array_equal(P["qkvw"][i], h(i, "attn.c_attn.weight").T), "qkvw transposed")
            check(np.array_equal(P["attprojw"][i], h(i, "attn.c_proj.weight").T), "attprojw")
            check(np.array_equal(P["fcw"][i], h(i, "mlp.c_fc.weight").T), "fcw")
            check(np.array_equal(P["fcprojw"][i], h(i, "mlp.c_proj.weight").T), "fcprojw")
            check(np.array_equal(P["ln2b"][i], h(i, "ln_2.bias")), "ln2b")
        check(np.array_equal(P["lnfw"], W["transformer.ln_f.weight"]), "lnfw")
        with open(os.path.join(llmc, "tokenizer.bin"), "rb") as f:
            th = np.frombuffer(f.read(1024), dtype="<i4")
            check(list(th[:4]) == [20240328, 2, V, reference.token_to_id(EOT)], f"tokenizer.bin {th[:4]}")
            dec = byte_decoder()
            with open(vocab, encoding="utf-8") as vf:
                by_id = {i: t for t, i in json.load(vf).items()}
            for i in range(V):
                n = f.read(1)[0]
                data = f.read(n)
                want = EOT.encode() if by_id[i] == EOT else bytes(dec[ch] for ch in by_id[i])
                check(data == want, f"tokenizer.bin token {i}: {data!r} != {want!r}")
            check(f.read() == b"", "tokenizer.bin has trailing bytes")

        # --- errors: nothing written ---
        before = sorted(os.listdir(hf))
        r = run([worker, "export", "--checkpoint", ckpt, "--output", hf])
        check(r.returncode == 2 and "not an empty directory" in r.stderr and
              sorted(os.listdir(hf)) == before, f"non-empty output: {r.returncode} {r.stderr}")
        bad = os.path.join(work, "bad.safetensors")
        shutil.copy(ckpt, bad)
        with open(bad, "r+b") as f:
            f.seek(-100, 2)
            byte = f.read(1)
            f.seek(-100, 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        out_bad = os.path.join(work, "out-bad")
        r = run([worker, "export", "--checkpoint", bad, "--output", out_bad])
        check(r.returncode == 4 and not os.path.exists(out_bad) and
              not [n for n in os.listdir(work) if n.startswith(".out-bad")],
              f"corrupt checkpoint: exit {r.returncode} {r.stderr}")

        # --- sample ---
        def sample(*extra):
            r = run([worker, "sample", "--checkpoint", ckpt, "--tokens", "16", *extra])
            check(r.returncode == 0, f"sample {extra}: {r.stderr}")
            return r.stdout
        check(sample("--seed", "5") == sample("--seed", "5"), "the same seed gave different text")
        check(sample("--seed", "5") != sample("--seed", "6"), "seeds 5 and 6 gave the same text")
        prompt = "the cat sat on"
        got = run([worker, "sample", "--checkpoint", ckpt, "--tokens", "20", "--temperature", "0",
                   "--ignore-eot", "--prompt", prompt])
        check(got.returncode == 0, f"greedy sample: {got.stderr}")
        ids = reference.encode(prompt).ids
        new = []
        for _ in range(20):
            logits = forward(cfg, W, [ids[-CTX:]])[0, -1]
            new.append(int(np.argmax(logits)))
            ids.append(new[-1])
        want = prompt + reference.decode(new, skip_special_tokens=False)
        check(got.stdout == want + "\n", f"greedy sample {got.stdout!r} != numpy greedy {want!r}")
        print(f"PASS export_sample_test: numpy loss {numpy_loss:.6f} == eval {ev['mean_loss']:.6f}; "
              f"hf + llmc exports; greedy sample == numpy greedy; {len(events)} TensorBoard samples")


if __name__ == "__main__":
    main()
