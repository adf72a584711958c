// Supervisor benchmark: what checkpointing, events and the supervisor cost a training loop.
//
//   cmake --build build/ci --target supervisor_bench
//   build/ci/bench/supervisor_bench [--params 124439808] [--dir bench-supervisor] [--saves 5]
//                                   [--events 200000] [--steps 200000]
//
// For a GPT-2 124M-sized state (parameters + two AdamW moments, fp32: ~1.5 GB) it measures, on
// the disk holding --dir:
//   * stall per checkpoint: how long the training thread is blocked (snapshot copy into a reused
//     slot) when AsyncCheckpointer takes a checkpoint;
//   * write time per checkpoint on the writer thread (CRC-32C + safetensors + fsync + rename +
//     state file), and the equivalent throughput; then, apart, the retention that follows the
//     commit (deleting the oldest checkpoint: freeing a 1.5 GB file costs a filesystem tens to
//     hundreds of ms, which the plain write, whose file is removed untimed, does not pay);
//   * the baselines, on the same disk, from the same kind of memory (the state's own tensors,
//     one write(2) each, the checkpoint's open flags): a plain sequential write + fsync of the
//     same bytes, and the same write paced like a streaming writer (sync_file_range every
//     32 MiB; on a slow disk the naive write is throttled by the dirty page limits, and the paced
//     one is the disk's ceiling). The three writes alternate in a rotating order, the disk
//     settled (syncfs, untimed) before each, and the checkpoint's time is divided by each
//     baseline's within the same round: the median and spread of those ratios are reported, so
//     that a disk or a machine whose speed drifts during the run (shared cloud disks and busy
//     machines do) affects all alike;
//   * the CRC-32C of the whole state alone (computed beside the copy, on the writer's helper
//     thread);
//   * `sync:` the plain write and a synchronous save on the main thread, alternated the same
//     way, by that thread's CPU time: the critical path, which a loaded machine delays but does
//     not add to (on tmpfs, the writer's own overhead); then where the save's wall time went,
//     phase by phase (header, write(2), writeback pacing, waiting for the checksums, fsync,
//     rename + directory fsync, state file), from CheckpointManager's SaveTimes;
//   * events writer records/s (add_scalar + framing + buffered writes);
//   * supervisor overhead per step with every service on (checkpoint service, summary service,
//     step counter): step_boundary() when nothing is due, and add_scalar() per step.
// Prints one table. --params scales the state down (e.g. --params 10000000 for a quick run).
// The full size writes ~1.5 GB per save plus the baseline file; files are removed at the end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <longhaul/base/crc32c.h>
#include <longhaul/base/log.h>
#include <longhaul/supervisor/async_checkpointer.h>
#include <longhaul/supervisor/coordinator.h>
#include <longhaul/supervisor/events.h>
#include <longhaul/supervisor/supervisor.h>

namespace sup = longhaul::supervisor;
using Clock = std::chrono::steady_clock;

namespace {

// CPU time (user + system) of this process so far: the work of a phase, which a machine shared
// with other jobs stretches far less than its wall time. Kernel threads (writeback, the block
// device) are not counted.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// CPU time of the calling thread: the work on a write's critical path, which other jobs on a
// shared machine delay but do not add to (a helper thread's work is not counted).
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A state shaped like GPT-2's parameters plus two AdamW moments, in tensors of at most 2.36M
// elements (the size of one c_attn weight), fp32.
class BenchState : public sup::TrainingState {
 public:
  explicit BenchState(int64_t params) {
    const int64_t chunk = 768 * 3072;
    for (const char* group : {"", "optimizer.m.", "optimizer.v."}) {
      int64_t left = params;
      for (int i = 0; left > 0; ++i) {
        int64_t n = std::min(chunk, left);
        specs_.push_back({std::string(group) + "transformer.h." + std::to_string(i) + ".weight",
                          sup::DType::kF32,
                          {n}});
        left -= n;
      }
    }
    for (const auto& s : specs_) {
      data_.emplace_back(static_cast<size_t>(s.numel()));
      for (size_t j = 0; j < data_.back().size(); j += 1024) data_.back()[j] = float(j);
    }
  }
  std::vector<sup::TensorSpec> tensor_specs() const override { return specs_; }
  void initialize() override { step_ = 0; }
  void restore(const sup::TensorSource&) override {}
  void snapshot(sup::Snapshot& out) override {
    out.reshape(specs_);
    for (size_t i = 0; i < specs_.size(); ++i) {
      std::memcpy(out.buffers[i].data(), data_[i].data(), out.buffers[i].size());
    }
    out.step = step_;
  }
  int64_t global_step() const override { return step_; }
  void step() { ++step_; }
  // The CRC-32C of every tensor, as the writer computes them (combined into one value).
  uint32_t checksum_all() const {
    uint32_t combined = 0;
    for (const auto& d : data_) combined ^= longhaul::crc32c::value(d.data(), d.size() * 4);
    return combined;
  }
  // The state's tensors, as the plain write writes them.
  std::vector<std::span<const std::byte>> spans() const {
    std::vector<std::span<const std::byte>> out;
    for (const auto& d : data_) out.push_back(std::as_bytes(std::span<const float>(d)));
    return out;
  }
  uint64_t bytes() const {
    uint64_t b = 0;
    for (const auto& s : specs_) b += s.nbytes();
    return b;
  }

 private:
  std::vector<sup::TensorSpec> specs_;
  std::vector<std::vector<float>> data_;
  std::atomic<int64_t> step_{0};
};

// The baseline: a plain sequential write + fsync of `spans` (the same tensor bytes the
// checkpoint writes, read from the same kind of cold, gigabyte-sized memory, in one write(2) per
// tensor), opened with the checkpoint's flags. No checksum, no header, no pacing, no rename.
//
// `paced`: the same, but the way a streaming writer (dd oflag=direct, fio, the checkpoint) keeps
// a disk busy without piling dirty pages: every 32 MiB written, its writeback is started
// (sync_file_range) and the 32 MiB before it is waited for and dropped from the page cache. A
// naive write + fsync of 1.5 GB first fills the page cache and is then throttled by the dirty
// page limits (balance_dirty_pages), so on a slow disk it is not the disk's ceiling; this is.
double plain_write(const std::filesystem::path& path,
                   const std::vector<std::span<const std::byte>>& spans, bool paced = false) {
  constexpr uint64_t kChunk = 32 << 20;
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  uint64_t written = 0, started = 0;
  for (auto span : spans) {
    while (!span.empty()) {
      ssize_t w = ::write(fd, span.data(), span.size());
      if (w <= 0) throw std::runtime_error("write failed on " + path.string());
      span = span.subspan(static_cast<size_t>(w));
      written += static_cast<uint64_t>(w);
      while (paced && written - started >= kChunk) {
        ::sync_file_range(fd, static_cast<off_t>(started), kChunk, SYNC_FILE_RANGE_WRITE);
        if (started >= kChunk) {
          const auto prev = static_cast<off_t>(started - kChunk);
          ::sync_file_range(
              fd, prev, kChunk,
              SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
          ::posix_fadvise(fd, prev, kChunk, POSIX_FADV_DONTNEED);
        }
        started += kChunk;
      }
    }
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync failed on " + path.string());
  ::close(fd);
  return secs(t0, Clock::now());  // the caller removes the file, untimed
}

// Flushes whatever the filesystem holding `dir` still has to write (the file the previous leg
// removed, retention's unlinks, the journal), untimed, so that neither write inherits the other's
// leftovers. The page cache is not dropped: it holds other people's work on a shared machine, and
// both writes create a new file whose pages are not cached anyway.
void settle(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::syncfs(fd);
  ::close(fd);
}

// Median and spread of a set of values.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
std::string range(const Spread& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "min %.3f max %.3f", s.min, s.max);
  return buf;
}

void row(const char* what, double value, const char* unit, const std::string& note = "") {
  std::printf("| %-44s | %14.3f | %-8s | %s\n", what, value, unit, note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 124439808;  // GPT-2 124M
  std::filesystem::path dir = "bench-supervisor";
  int saves = 5;
  int64_t events = 200000;
  int64_t steps = 200000;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h" || i + 1 >= argc) {
      std::printf(
          "usage: supervisor_bench [--params 124439808] [--dir bench-supervisor] [--saves 5]\n"
          "                        [--events 200000] [--steps 200000]\n"
          "Checkpoint stall and write time vs a plain write + fsync of the same bytes on the\n"
          "disk holding --dir (alternated, medians), events records/s, per-step overhead.\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
    if (a == "--params")
      params = std::stoll(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--saves")
      saves = std::stoi(argv[i + 1]);
    else if (a == "--events")
      events = std::stoll(argv[i + 1]);
    else if (a == "--steps")
      steps = std::stoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  longhaul::log::set_level(longhaul::log::Level::kWarning);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  BenchState state(params);
  const double gb = static_cast<double>(state.bytes()) / 1e9;
  std::printf(
      "supervisor_bench: %lld params x 3 (params + 2 moments), %.3f GB per checkpoint, "
      "dir %s\n\n",
      static_cast<long long>(params), gb, dir.c_str());
  std::printf("| %-44s | %14s | %-8s | %s\n", "measurement", "value", "unit", "note");
  std::printf("|%s|%s|%s|%s\n", std::string(46, '-').c_str(), std::string(16, '-').c_str(),
              std::string(10, '-').c_str(), std::string(30, '-').c_str());

  auto gbps = [&](double s) { return std::to_string(gb / s).substr(0, 5) + " GB/s"; };

  // 1. Async checkpoints (the path a training loop uses) and plain writes of the same bytes,
  //    alternated in pairs whose order flips each time (plain first, then checkpoint first), the
  //    disk settled (syncfs) before each: a drifting disk or load, and whatever one write leaves
  //    behind for the next, hit both alike. The ratio is taken per pair, then its median and
  //    spread are reported.
  {
    sup::CheckpointManager manager({dir, "model.ckpt", 2, 0});
    sup::Coordinator coord;
    sup::AsyncCheckpointer ckpt(manager, &coord);
    auto p0 = Clock::now();
    ckpt.preallocate(state.tensor_specs());  // what the supervisor does at session start
    const double prealloc = secs(p0, Clock::now());
    const auto plain_spans = state.spans();
    std::vector<double> plains, paced, stalls, stall_cpus, writes, ratios, paced_ratios, retentions,
        plain_cpus, write_cpus;
    for (int i = 0; i < saves; ++i) {
      auto plain_leg = [&] {
        settle(dir);
        const double cpu0 = cpu_seconds();
        plains.push_back(plain_write(dir / "plain.bin", plain_spans));
        plain_cpus.push_back(cpu_seconds() - cpu0);
        std::filesystem::remove(dir / "plain.bin");
      };
      auto paced_leg = [&] {
        settle(dir);
        paced.push_back(plain_write(dir / "plain.bin", plain_spans, /*paced=*/true));
        std::filesystem::remove(dir / "plain.bin");
      };
      auto checkpoint_leg = [&] {
        settle(dir);
        state.step();
        auto t0 = Clock::now();
        const double stall_cpu0 = thread_cpu_seconds();
        ckpt.request([&](sup::Snapshot& s) { state.snapshot(s); },
                     sup::AsyncCheckpointer::Mode::kQueue);
        stall_cpus.push_back(thread_cpu_seconds() - stall_cpu0);
        stalls.push_back(secs(t0, Clock::now()));
        const double cpu0 = cpu_seconds();  // the training thread sleeps in wait_idle
        ckpt.wait_idle();
        write_cpus.push_back(cpu_seconds() - cpu0);
        writes.push_back(ckpt.last_stats()->write_seconds);
        retentions.push_back(ckpt.last_stats()->retention_seconds);
      };
      // The three legs in a rotating order: each takes each position in turn.
      const std::function<void()> legs[] = {plain_leg, checkpoint_leg, paced_leg};
      for (int k = 0; k < 3; ++k) legs[(i + k) % 3]();
      ratios.push_back(writes.back() / plains.back());
      paced_ratios.push_back(writes.back() / paced.back());
    }
    ckpt.stop();
    coord.raise_requested_exception();
    const Spread plain = spread(plains), write = spread(writes), ratio = spread(ratios);
    row("plain sequential write + fsync, median", plain.median, "s",
        gbps(plain.median) + " " + range(plain));
    row("slot preallocation (session start)", prealloc, "s", "not a stall");
    row("checkpoint stall (training thread), first", stalls[0], "s", "copy into the slot");
    if (saves > 1)
      row("checkpoint stall (training thread), median",
          spread(std::vector<double>(stalls.begin() + 1, stalls.end())).median, "s",
          "copy into the reused slot");
    row("checkpoint stall, training thread CPU, median", spread(stall_cpus).median, "s",
        "the stall's work; the rest of it is waiting for a CPU");
    row("checkpoint write (writer thread), median", write.median, "s",
        gbps(write.median) + " " + range(write));
    row("checkpoint / plain time, per pair: median", ratio.median, "x",
        range(ratio) + " over " + std::to_string(saves) + " pairs");
    row("plain / checkpoint time = throughput ratio", 1.0 / ratio.median, "x",
        "the target is >= 0.95");
    const Spread pace = spread(paced), paced_ratio = spread(paced_ratios);
    row("plain write, paced (sync_file_range), median", pace.median, "s",
        gbps(pace.median) + " " + range(pace));
    row("checkpoint / paced plain time, per pair", paced_ratio.median, "x",
        range(paced_ratio) + "; throughput ratio " +
            std::to_string(1.0 / paced_ratio.median).substr(0, 5));
    row("retention after the commit, median", spread(retentions).median, "s",
        "deleting the oldest checkpoint (max_to_keep 2)");
    row("CPU time: plain write + fsync, median", spread(plain_cpus).median, "s", "user + system");
    row("CPU time: checkpoint write, median", spread(write_cpus).median, "s",
        "user + system, both threads; x" +
            std::to_string(spread(write_cpus).median / spread(plain_cpus).median).substr(0, 5) +
            " the plain write's");
    auto c0 = Clock::now();
    const uint32_t combined = state.checksum_all();
    const double crc_s = secs(c0, Clock::now());
    char note[64];
    std::snprintf(note, sizeof note, " (combined %08x)", combined);
    row("CRC-32C of the whole state, alone", crc_s, "s", gbps(crc_s) + note);
    auto t0 = Clock::now();
    auto reader = manager.latest_valid();
    row("latest_valid (open + verify every CRC)", secs(t0, Clock::now()), "s",
        reader ? "ok (the writer dropped its pages: read from disk)" : "FAILED");
  }

  // 2. The same two writes on this thread, synchronously (pairs alternated as above), by the
  //    CPU time of this thread: the work on each write's critical path, which a loaded machine
  //    delays (wall time) but does not add to. On tmpfs, where the "disk" is that work, this is
  //    the writer's own overhead. The checkpoint's helper thread (its checksums, in parallel) is
  //    not counted; retention is off (max_to_keep 0) and every file is removed untimed. Then
  //    where the checkpoint's wall time went, phase by phase (medians; SaveTimes).
  {
    sup::CheckpointManager manager({dir / "sync", "model.ckpt", 0, 0});
    sup::Snapshot snapshot;
    state.snapshot(snapshot);
    std::vector<std::span<const std::byte>> plain_spans;
    for (const auto& b : snapshot.buffers) plain_spans.emplace_back(b);
    std::vector<double> cpu_ratios, wall_ratios, plain_cpu, save_cpu, plain_wall, save_wall;
    std::vector<sup::SaveTimes> phases;
    for (int i = 0; i < saves; ++i) {
      auto plain_leg = [&] {
        settle(dir);
        const double c0 = thread_cpu_seconds();
        plain_wall.push_back(plain_write(dir / "plain.bin", plain_spans));
        plain_cpu.push_back(thread_cpu_seconds() - c0);
        std::filesystem::remove(dir / "plain.bin");
      };
      auto checkpoint_leg = [&] {
        settle(dir);
        snapshot.step = 1000 + i;
        const double c0 = thread_cpu_seconds();
        auto t0 = Clock::now();
        sup::SaveTimes times;
        const auto file = manager.save(snapshot, -1, &times);
        save_wall.push_back(secs(t0, Clock::now()));
        save_cpu.push_back(thread_cpu_seconds() - c0);
        phases.push_back(times);
        std::filesystem::remove(file);
      };
      if (i % 2 == 0) {
        plain_leg();
        checkpoint_leg();
      } else {
        checkpoint_leg();
        plain_leg();
      }
      cpu_ratios.push_back(save_cpu.back() / plain_cpu.back());
      wall_ratios.push_back(save_wall.back() / plain_wall.back());
    }
    const Spread cpu_ratio = spread(cpu_ratios), wall_ratio = spread(wall_ratios);
    row("sync: plain write, thread CPU, median", spread(plain_cpu).median, "s",
        "wall median " + std::to_string(spread(plain_wall).median).substr(0, 5) + " s");
    row("sync: checkpoint save, thread CPU, median", spread(save_cpu).median, "s",
        "wall median " + std::to_string(spread(save_wall).median).substr(0, 5) + " s");
    row("sync: checkpoint / plain, thread CPU, per pair", cpu_ratio.median, "x", range(cpu_ratio));
    row("sync: checkpoint / plain, wall, per pair", wall_ratio.median, "x", range(wall_ratio));
    auto phase = [&](const char* what, double (*get)(const sup::SaveTimes&), const char* note,
                     const char* unit = "s") {
      std::vector<double> v;
      for (const auto& p : phases) v.push_back(get(p));
      row(what, spread(v).median, unit, note);
    };
    phase(
        "sync save phases: whole save", [](const sup::SaveTimes& t) { return t.commit_seconds; },
        "checkpoint file + state file");
    phase(
        "  header JSON (twice)", [](const sup::SaveTimes& t) { return t.data.header_seconds; }, "");
    phase(
        "  write(2): copy into the page cache",
        [](const sup::SaveTimes& t) { return t.data.file.write_seconds; }, "");
    phase(
        "  writeback pacing (sync_file_range, fadvise)",
        [](const sup::SaveTimes& t) { return t.data.file.writeback_seconds; },
        "waiting for the disk");
    phase(
        "  waiting for the checksum helper",
        [](const sup::SaveTimes& t) { return t.data.checksum_wait_seconds; },
        "after the last write");
    phase(
        "  fsync of the file", [](const sup::SaveTimes& t) { return t.data.file.fsync_seconds; },
        "");
    phase(
        "  rename + directory fsync",
        [](const sup::SaveTimes& t) { return t.data.file.rename_seconds; }, "");
    phase(
        "  state file (write, fsync, rename, dir fsync)",
        [](const sup::SaveTimes& t) { return t.state_file_seconds; }, "");
    phase(
        "  the rest (loop, check, bookkeeping)",
        [](const sup::SaveTimes& t) {
          const auto& d = t.data;
          return t.commit_seconds - d.header_seconds - d.file.write_seconds -
                 d.file.writeback_seconds - d.checksum_wait_seconds - d.file.fsync_seconds -
                 d.file.rename_seconds - t.state_file_seconds;
        },
        "");
    phase(
        "  checksum helper: times it slept",
        [](const sup::SaveTimes& t) { return double(t.data.checksum_sleeps); },
        "futex waits; each one a wake-up (context switch)", "count");
    phase(
        "  checksums (helper thread CPU, in parallel)",
        [](const sup::SaveTimes& t) { return t.data.checksum_seconds; }, "not on the path above");
  }

  // 3. Events writer.
  {
    sup::EventsWriter writer(dir, {.flush_secs = 1});
    auto t0 = Clock::now();
    for (int64_t i = 0; i < events; ++i) writer.add_scalar("loss", 1.0 / double(i + 1), i);
    writer.flush();
    double s = secs(t0, Clock::now());
    writer.close();
    row("events add_scalar + flush", static_cast<double>(events) / s, "rec/s",
        std::to_string(std::filesystem::file_size(writer.path()) / s / 1e6).substr(0, 6) + " MB/s");
  }

  // 4. Supervisor overhead per step, every service on (intervals short enough to fire).
  {
    BenchState small(1000);
    auto bare_t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i) small.step();
    double bare = secs(bare_t0, Clock::now());

    sup::SupervisorOptions opts;
    opts.logdir = dir / "session";
    opts.save_model_secs = 0.5;
    opts.save_summaries_secs = 0.1;
    opts.events_flush_secs = 0.5;
    double boundary_s = 0, scalar_s = 0;
    sup::Supervisor sv(opts);
    sv.managed_session(small, [&](sup::Supervisor& sv) {
      auto t0 = Clock::now();
      for (int64_t i = 0; i < steps; ++i) {
        small.step();
        sv.step_boundary(small.global_step());
      }
      boundary_s = secs(t0, Clock::now());
      t0 = Clock::now();
      for (int64_t i = 0; i < steps; ++i) {
        small.step();
        sv.add_scalar("loss", 0.5, small.global_step());
        sv.step_boundary(small.global_step());
      }
      scalar_s = secs(t0, Clock::now());
    });
    row("step_boundary() per step, services on", (boundary_s - bare) / double(steps) * 1e9, "ns",
        std::to_string(sv.checkpoints_saved()) + " checkpoints taken meanwhile");
    row("add_scalar() + step_boundary() per step", (scalar_s - bare) / double(steps) * 1e9, "ns",
        "");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
