#!/usr/bin/env python3
"""Reads a longhaul-worker logdir with the tools users run: TensorBoard and safetensors.

Trains a very small model with a SIGTERM + resume in the middle, then checks that
  * TensorBoard's EventAccumulator sees every scalar tag (loss, learning_rate, grad_norm,
    tokens_per_sec, global_step/sec) and loss/learning_rate/grad_norm/tokens_per_sec at every
    step index 0..N-1 exactly once across both events files (the restart is seamless);
  * TensorBoard's event file loader sees, per file, file_version "brain.Event:2" first, a
    SessionLog START at the restored step, CHECKPOINT records naming checkpoint files, and STOP
    at the step the run ended;
  * the `safetensors` package loads every checkpoint (numpy), with the Hugging Face GPT-2 names
    and shapes `longhaul-worker inspect --json --tensors` reports, values whose CRC-32C matches
    the per-tensor checksums in __metadata__, and metadata step == file name step.

Usage: python logdir_test.py --worker build/.../longhaul-worker   (prints "PASS ..." or fails)
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

MAX_STEPS = 1000
STOP_AFTER = 300  # SIGTERM once this step is printed
CONFIG = f"""
model: {{preset: tiny, n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}}
training: {{batch_size: 8, seq_len: 32, max_steps: {MAX_STEPS}, learning_rate: 0.01, warmup_steps: 5}}
checkpoint: {{save_model_secs: 0, save_model_steps: 125, max_to_keep: 0}}
summaries: {{every_steps: 1, save_summaries_secs: 0.05}}
log: {{every_steps: 1}}
eval: {{every_steps: 0}}
"""
SCALAR_TAGS = ["loss", "learning_rate", "grad_norm", "tokens_per_sec"]


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def check(condition, message):
    if not condition:
        print("FAIL: " + message, file=sys.stderr)
        sys.exit(1)


def train_with_restart(worker, work):
    with open(os.path.join(work, "cfg.yaml"), "w") as f:
        f.write(CONFIG)
    cmd = [worker, "train", "--config", "cfg.yaml", "--logdir", "run"]
    out_path = os.path.join(work, "first.out")
    with open(out_path, "w") as out, open(os.path.join(work, "first.err"), "w") as err:
        p = subprocess.Popen(cmd, cwd=work, stdout=out, stderr=err)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            with open(out_path) as f:
                steps = re.findall(r"step +(\d+)/", f.read())
                if steps and int(steps[-1]) >= STOP_AFTER:
                    break
            time.sleep(0.01)  # poll the output condition
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=120)
    check(code == 143, f"first run should exit 143 after SIGTERM, got {code}")
    second = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    check(second.returncode == 0, f"resumed run failed: {second.returncode}\n{second.stderr}")
    m = re.search(r"resuming at step (\d+)/", second.stdout)
    check(m is not None, "second run did not resume:\n" + second.stdout)
    stop_step = int(m.group(1))
    check(STOP_AFTER <= stop_step < MAX_STEPS, f"SIGTERM step {stop_step} not inside the run")
    return stop_step


def check_events(logdir, stop_step):
    files = [f for f in os.listdir(logdir) if f.startswith("events.out.tfevents.")]
    # In run order: by the wall time of each file's first record (names tie within a second).
    files.sort(key=lambda f: next(iter(EventFileLoader(os.path.join(logdir, f)).Load())).wall_time)
    check(len(files) == 2, f"expected one events file per run, got {files}")
    expected_sessions = [(0, stop_step), (stop_step, MAX_STEPS)]
    for name, (start, stop) in zip(files, expected_sessions):
        events = list(EventFileLoader(os.path.join(logdir, name)).Load())
        check(events[0].file_version == "brain.Event:2", f"{name}: first record is not file_version")
        logs = [(e.session_log.status, e.step, e.session_log.checkpoint_path)
                for e in events if e.HasField("session_log")]
        statuses = [s for s, _, _ in logs]
        check(statuses[0] == 1 and logs[0][1] == start,  # START
              f"{name}: first session log should be START at {start}: {logs}")
        check(statuses[-1] == 2 and logs[-1][1] == stop,  # STOP
              f"{name}: last session log should be STOP at {stop}: {logs}")
        ckpts = [(step, path) for s, step, path in logs if s == 3]  # CHECKPOINT
        check(ckpts, f"{name}: no CHECKPOINT session log")
        for step, path in ckpts:
            check(f"model.ckpt-{step}" in path, f"{name}: CHECKPOINT at {step} names {path}")
        # The device plan (worker/selfcheck) is the first summary: a TensorBoard text summary.
        summaries = [e for e in events if e.HasField("summary")]
        first = summaries[0].summary.value[0]
        check(first.tag == "device" and first.metadata.plugin_data.plugin_name == "text",
              f"{name}: the first summary is not the 'device' text: {first.tag}")
        text = first.tensor.string_val[0].decode()
        check("device cpu" in text and "self-check" in text, f"{name}: device text is {text!r}")

    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    check("device" in acc.Tags()["tensors"], f"no 'device' text summary: {acc.Tags()}")
    tags = acc.Tags()["scalars"]
    for tag in SCALAR_TAGS + ["global_step/sec"]:
        check(tag in tags, f"scalar tag {tag} missing; have {tags}")
    for tag in SCALAR_TAGS:
        steps = [e.step for e in acc.Scalars(tag)]
        check(steps == list(range(0, MAX_STEPS)),
              f"{tag}: steps are not 0..{MAX_STEPS - 1} exactly once: {steps[:5]}... "
              f"({len(steps)} values)")
        values = np.array([e.value for e in acc.Scalars(tag)])
        check(np.all(np.isfinite(values)), f"{tag} has non-finite values")
    loss = np.array([e.value for e in acc.Scalars("loss")])
    check(loss[-20:].mean() < loss[:5].mean() - 0.5, "loss did not fall")
    return len(tags)


def check_checkpoints(worker, logdir):
    inspect = subprocess.run([worker, "inspect", logdir, "--json", "--tensors"],
                             capture_output=True, text=True, timeout=120)
    check(inspect.returncode == 0, "inspect failed: " + inspect.stderr)
    report = json.loads(inspect.stdout)
    expected = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in report["restore"]["tensors"]}
    check(report["restore"]["step"] == MAX_STEPS, f"restore target {report['restore']}")
    files = sorted(f for f in os.listdir(logdir) if re.fullmatch(r"model\.ckpt-\d+\.safetensors", f))
    check(len(files) >= 8, f"expected checkpoints every 125 steps and at the stop, got {files}")
    listed = {c["file"]: c for c in report["checkpoints"]}
    for name in files:
        path = os.path.join(logdir, name)
        step = int(re.search(r"-(\d+)\.", name).group(1))
        tensors = load_file(path)
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata()
        check(set(tensors) == set(expected), f"{name}: tensor names differ from inspect's")
        for tname, array in tensors.items():
            dtype, shape = expected[tname]
            check(array.dtype == np.float32 and dtype == "F32", f"{name}:{tname} dtype")
            check(array.shape == shape, f"{name}:{tname} shape {array.shape} != {shape}")
            check(np.all(np.isfinite(array)), f"{name}:{tname} has non-finite values")
        crcs = json.loads(metadata["crc32c"])
        for tname in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                      "optimizer.exp_avg_sq.transformer.ln_f.bias"):
            got = crc32c(tensors[tname].tobytes())
            check(int(crcs[tname], 16) == got, f"{name}:{tname} CRC-32C mismatch")
        check(int(metadata["global_step"]) == step, f"{name}: global_step metadata")
        check(int(metadata["step"]) == step, f"{name}: step metadata")
        check(metadata["device"].startswith("device cpu"), f"{name}: device metadata")
        check(json.loads(metadata["kernels"])["device"] == "cpu", f"{name}: kernels metadata")
        check(listed[name]["valid"], f"inspect says {name} is invalid")
        check(np.all(tensors["optimizer.exp_avg_sq.transformer.wte.weight"] >= 0),
              f"{name}: negative second moment")
    hf = load_file(os.path.join(logdir, files[-1]))
    check(hf["transformer.h.0.attn.c_attn.weight"].shape == (32, 96), "Conv1D layout (C, 3C)")
    check(hf["transformer.wpe.weight"].shape == (32, 32), "wpe (maxT, C)")
    return len(files)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="longhaul_tools_")
    try:
        stop_step = train_with_restart(os.path.abspath(args.worker), work)
        logdir = os.path.join(work, "run")
        n_tags = check_events(logdir, stop_step)
        n_ckpts = check_checkpoints(os.path.abspath(args.worker), logdir)
    except SystemExit:
        print(f"logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work)
    print(f"PASS tools_logdir_test: restart at step {stop_step}; tensorboard saw {n_tags} scalar "
          f"tags over steps 0..{MAX_STEPS - 1}; safetensors loaded {n_ckpts} checkpoints")


if __name__ == "__main__":
    main()
