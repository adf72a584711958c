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
//   * a plain sequential write + fsync of the same number of bytes to the same directory: the
//     disk's ceiling. It alternates with the checkpoints (one before each), and both are reported
//     as medians, so that a disk or a machine whose speed drifts during the run (shared cloud
//     disks do) affects both alike;
//   * the CRC-32C of the whole state alone (computed beside the copy, on the writer's helper
//   thread);
//   * `sync:` the plain write and a synchronous save on the main thread, by that thread's CPU
//     time: the critical path, which a loaded machine delays but does not add to (on tmpfs, the
//     writer's own overhead);
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

double plain_write(const std::filesystem::path& path, uint64_t bytes) {
  std::vector<char> buf(8 << 20, 'x');
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  uint64_t left = bytes;
  while (left > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    ssize_t w = ::write(fd, buf.data(), n);
    if (w <= 0) throw std::runtime_error("write failed on " + path.string());
    left -= static_cast<uint64_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  return secs(t0, Clock::now());  // the caller removes the file, untimed
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

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto gbps = [&](double s) { return std::to_string(gb / s).substr(0, 5) + " GB/s"; };

  // 1. Async checkpoints, each after a plain sequential write + fsync of the same bytes (the
  //    baseline): the stall on the training thread vs the write time on the writer thread.
  {
    sup::CheckpointManager manager({dir, "model.ckpt", 2, 0});
    sup::Coordinator coord;
    sup::AsyncCheckpointer ckpt(manager, &coord);
    auto p0 = Clock::now();
    ckpt.preallocate(state.tensor_specs());  // what the supervisor does at session start
    const double prealloc = secs(p0, Clock::now());
    std::vector<double> plains, stalls, writes, retentions, plain_cpus, write_cpus;
    for (int i = 0; i < saves; ++i) {
      double cpu0 = cpu_seconds();
      plains.push_back(plain_write(dir / "plain.bin", state.bytes()));
      plain_cpus.push_back(cpu_seconds() - cpu0);
      std::filesystem::remove(dir / "plain.bin");
      state.step();
      auto t0 = Clock::now();
      ckpt.request([&](sup::Snapshot& s) { state.snapshot(s); },
                   sup::AsyncCheckpointer::Mode::kQueue);
      stalls.push_back(secs(t0, Clock::now()));
      cpu0 = cpu_seconds();  // the training thread sleeps in wait_idle: this is the writer's
      ckpt.wait_idle();
      write_cpus.push_back(cpu_seconds() - cpu0);
      writes.push_back(ckpt.last_stats()->write_seconds);
      retentions.push_back(ckpt.last_stats()->retention_seconds);
    }
    ckpt.stop();
    coord.raise_requested_exception();
    const double plain = median(plains);
    row("plain sequential write + fsync, median", plain, "s", gbps(plain));
    row("slot preallocation (session start)", prealloc, "s", "not a stall");
    row("checkpoint stall (training thread), first", stalls[0], "s", "copy into the slot");
    if (saves > 1)
      row("checkpoint stall (training thread), median",
          median(std::vector<double>(stalls.begin() + 1, stalls.end())), "s",
          "copy into the reused slot");
    row("checkpoint write (writer thread), median", median(writes), "s",
        gbps(median(writes)) + " incl. CRC + fsync + state file");
    row("write time / plain write (medians)", median(writes) / plain, "x",
        "min " +
            std::to_string(*std::min_element(writes.begin(), writes.end()) /
                           *std::min_element(plains.begin(), plains.end()))
                .substr(0, 5) +
            " (fastest of each)");
    row("retention after the commit, median", median(retentions), "s",
        "deleting the oldest checkpoint (max_to_keep 2)");
    row("CPU time: plain write + fsync, median", median(plain_cpus), "s", "user + system");
    row("CPU time: checkpoint write, median", median(write_cpus), "s",
        "user + system; x" + std::to_string(median(write_cpus) / median(plain_cpus)).substr(0, 5) +
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

  // 2b. The same two writes on this thread, synchronously, by the CPU time of this thread: the
  //     work on each write's critical path, which a loaded machine delays (wall time) but does
  //     not add to. On tmpfs, where the "disk" is that work, this is the writer's own overhead.
  //     The checkpoint's helper thread (its checksums, in parallel) is not counted; retention is
  //     off (max_to_keep 0) and every file is removed untimed.
  {
    sup::CheckpointManager manager({dir / "sync", "model.ckpt", 0, 0});
    sup::Snapshot snapshot;
    state.snapshot(snapshot);
    std::vector<double> plain_cpu, save_cpu, plain_wall, save_wall;
    for (int i = 0; i < saves; ++i) {
      double c0 = thread_cpu_seconds();
      plain_wall.push_back(plain_write(dir / "plain.bin", state.bytes()));
      plain_cpu.push_back(thread_cpu_seconds() - c0);
      std::filesystem::remove(dir / "plain.bin");
      snapshot.step = 1000 + i;
      c0 = thread_cpu_seconds();
      auto t0 = Clock::now();
      const auto file = manager.save(snapshot);
      save_wall.push_back(secs(t0, Clock::now()));
      save_cpu.push_back(thread_cpu_seconds() - c0);
      std::filesystem::remove(file);
    }
    row("sync: plain write, thread CPU, median", median(plain_cpu), "s",
        "wall median " + std::to_string(median(plain_wall)).substr(0, 5) + " s");
    row("sync: checkpoint save, thread CPU, median", median(save_cpu), "s",
        "wall median " + std::to_string(median(save_wall)).substr(0, 5) + " s");
    row("sync: checkpoint / plain, thread CPU", median(save_cpu) / median(plain_cpu), "x",
        "plain / checkpoint throughput: " +
            std::to_string(median(plain_cpu) / median(save_cpu)).substr(0, 5));
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
