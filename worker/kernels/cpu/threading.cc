// The CPU kernels' thread team (parallel.h) and its public controls (threading.h).
#include "longhaul/kernels/cpu/threading.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "parallel.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace longhaul::kernels::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The first line of a small file, or "" when it cannot be read.
std::string read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// quota/period as whole CPUs rounded up; 0 for "no limit" or anything unparsable.
int whole_cpus(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::max(1LL, (quota + period - 1) / period));
}

// One cgroup directory's own limit: cgroup v2 "cpu.max" ("max 100000" or "150000 100000"),
// else v1 "cpu.cfs_quota_us" (-1: none) over "cpu.cfs_period_us".
int directory_limit(const std::filesystem::path& dir) {
  if (std::string max = read_line(dir / "cpu.max"); !max.empty()) {
    std::istringstream in(max);
    std::string quota;
    long long period = 0;
    in >> quota >> period;
    return quota == "max" ? 0 : whole_cpus(std::atoll(quota.c_str()), period);
  }
  const std::string quota = read_line(dir / "cpu.cfs_quota_us");
  if (quota.empty()) return 0;
  return whole_cpus(std::atoll(quota.c_str()),
                    std::atoll(read_line(dir / "cpu.cfs_period_us").c_str()));
}

// LONGHAUL_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may run on (its
// affinity mask, which container CPU sets narrow; else hardware_concurrency()) capped by its
// cgroup's CPU limit (which a container's `limits.cpu` sets).
int default_threads() {
  for (const char* name : {"LONGHAUL_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      const int n = std::atoi(value);
      if (n > 0) return n;
    }
  }
  int cpus = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  if (cpus <= 0) cpus = 1;
  std::ostringstream membership;
  membership << std::ifstream("/proc/self/cgroup").rdbuf();
  const int limit = cgroup_cpu_limit(membership.str(), "/sys/fs/cgroup");
  return limit > 0 ? std::min(cpus, limit) : cpus;
}

thread_local bool t_inside_team = false;

// Workers 1..size-1 (the caller is member 0). A job is published by bumping `generation_`;
// each worker runs its block and decrements `pending_`. Workers spin briefly on the generation
// before sleeping on `wake_`, the caller spins then sleeps on `done_`.
class Team {
 public:
  ~Team() { resize(1); }

  int size() const { return size_.load(std::memory_order_relaxed); }

  void resize(int threads) {
    std::lock_guard<std::mutex> lock(dispatch_mutex_);
    if (threads == size_) return;
    {
      std::lock_guard<std::mutex> state(state_mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    size_ = threads;
    // Workers start from the current generation: a job published before a worker first runs
    // is still seen as new by it.
    const uint64_t start = generation_.load(std::memory_order_acquire);
    for (int id = 1; id < threads; ++id) {
      workers_.emplace_back([this, id, start] { worker_loop(id, start); });
    }
  }

  void run(int64_t n, bool parallel, detail::BlockFn fn, void* context) {
    if (!parallel || n < 2 || t_inside_team) {
      fn(context, 0, n);
      return;
    }
    std::lock_guard<std::mutex> lock(dispatch_mutex_);
    const int members = static_cast<int>(std::min<int64_t>(size_.load(), n));
    if (members < 2) {
      fn(context, 0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> state(state_mutex_);
      job_ = Job{fn, context, n, members};
      pending_.store(members - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    t_inside_team = true;
    run_block(job_, 0);
    t_inside_team = false;
    for (int spin = 0; spin < kSpins && pending_.load(std::memory_order_acquire) != 0; ++spin) {
      cpu_relax();
    }
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> state(state_mutex_);
      done_.wait(state, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
  }

 private:
  static constexpr int kSpins = 2000;  // tens of microseconds: covers the gap between kernels

  struct Job {
    detail::BlockFn fn = nullptr;
    void* context = nullptr;
    int64_t n = 0;
    int members = 0;
  };

  static void run_block(const Job& job, int id) {
    if (id >= job.members) return;
    const int64_t per = job.n / job.members, extra = job.n % job.members;
    const int64_t begin = id * per + std::min<int64_t>(id, extra);
    const int64_t end = begin + per + (id < extra ? 1 : 0);
    if (begin < end) job.fn(job.context, begin, end);
  }

  void worker_loop(int id, uint64_t seen) {
    t_inside_team = true;
    for (;;) {
      Job job;
      for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen;
           ++spin) {
        cpu_relax();
      }
      {
        std::unique_lock<std::mutex> state(state_mutex_);
        wake_.wait(state, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        seen = generation_.load(std::memory_order_acquire);
        if (stop_) return;
        job = job_;
      }
      if (id < job.members) {
        run_block(job, id);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
          std::lock_guard<std::mutex> state(state_mutex_);
          done_.notify_one();
        }
      }
    }
  }

  std::mutex dispatch_mutex_;  // one job at a time; guards size_ and workers_
  std::atomic<int> size_{1};
  std::vector<std::thread> workers_;

  std::mutex state_mutex_;  // guards job_ and stop_ writes; paired with wake_ and done_
  std::condition_variable wake_, done_;
  Job job_;
  bool stop_ = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
};

Team& team() {
  static Team* instance = [] {
    static Team t;
    openblas_set_num_threads(1);  // OpenBLAS runs inside the team's threads, single-threaded
    t.resize(default_threads());
    return &t;
  }();
  return *instance;
}

}  // namespace

namespace detail {
void parallel_for_impl(int64_t n, bool parallel, BlockFn fn, void* context) {
  team().run(n, parallel, fn, context);
}
}  // namespace detail

void set_num_threads(int n) { team().resize(n <= 0 ? default_threads() : n); }

int num_threads() { return team().size(); }

int cgroup_cpu_limit(std::string_view proc_self_cgroup, const std::filesystem::path& root) {
  int limit = 0;
  auto consider = [&](const std::filesystem::path& mount, std::string_view cgroup_path) {
    // From the process's own cgroup up to the mount's root. Inside a container the listed path
    // may be the host's while the mount shows only the container's own cgroup: the walk then
    // reaches that at the mount's root.
    std::filesystem::path path = std::filesystem::path(cgroup_path).relative_path();
    for (;;) {
      const int here = directory_limit(mount / path);
      if (here > 0) limit = limit == 0 ? here : std::min(limit, here);
      if (path.empty()) break;
      path = path.parent_path();
    }
  };
  std::istringstream lines{std::string(proc_self_cgroup)};
  for (std::string line; std::getline(lines, line);) {
    // "hierarchy-id:controllers:path"; cgroup v2 is "0::path".
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string_view path = std::string_view(line).substr(second + 1);
    if (controllers.empty()) {
      consider(root, path);
      consider(root / "unified", path);
      continue;
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name != "cpu") continue;
      consider(root / controllers, path);
      if (controllers != "cpu") consider(root / "cpu", path);
    }
  }
  return limit;
}

}  // namespace longhaul::kernels::cpu
