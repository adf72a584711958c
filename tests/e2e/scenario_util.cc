// Helpers of the end-to-end scenarios (see scenario_util.h).
#include "scenario_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <unistd.h>

#include <longhaul/base/error.h>
#include <longhaul/e2e/local_cluster.h>
#include <longhaul/kubelet/pod_command.h>
#include <longhaul/supervisor/checkpoint_state.h>
#include <longhaul/supervisor/event.pb.h>
#include <longhaul/supervisor/events.h>
#include <longhaul/supervisor/safetensors.h>

#include "longhaul/testing/loopback.h"

namespace longhaul::e2e::testing {

fs::path binary_dir() {
  const char* env = std::getenv("LONGHAUL_BINARY_DIR");
  return env ? fs::path(env) : fs::current_path();
}

fs::path source_dir() {
  const char* env = std::getenv("LONGHAUL_SOURCE_DIR");
  return env ? fs::path(env) : fs::path(LONGHAUL_TEST_SOURCE_DIR);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string tail(const fs::path& path, size_t bytes) {
  const std::string text = read_text(path);
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

json tiny_job(bool with_worker) {
  for (const json& doc : load_manifests(source_dir() / "examples/trainingjob-tiny.yaml")) {
    if (doc.value("kind", "") != "TrainingJob") continue;
    json job = doc;
    if (!with_worker) job["spec"]["replicaSpecs"].erase("Worker");
    // The example's Chief serves /metrics on 9400, as on a cluster where each pod has its own
    // IP; scenarios run in parallel on one machine and pick a free port (serve_chief_metrics).
    json& chief = job["spec"]["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0];
    chief.erase("ports");
    json args = json::array();
    for (const json& a : chief["args"]) {
      if (!a.get<std::string>().starts_with("--metrics-port")) args.push_back(a);
    }
    chief["args"] = args;
    job["spec"]["runPolicy"]["nodeLostTimeoutSeconds"] = 1;
    return job;
  }
  ADD_FAILURE() << "examples/trainingjob-tiny.yaml holds no TrainingJob";
  return json::object();
}

void set_grace_period_5s(json& job) {
  for (const char* type : {"Chief", "Worker"}) {
    json& spec = job["spec"]["replicaSpecs"][type]["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = 5;
    // The worker's own grace stays inside the pod's, or the operator refuses the job
    // (InvalidSpec naming both fields).
    for (json& a : spec["containers"][0]["args"]) {
      if (a.is_string() && a.get<std::string>().starts_with("--set=grace_period_secs=")) {
        a = "--set=grace_period_secs=4";
      }
    }
  }
}

void regroup_on_peer_loss(json& job) {
  for (const char* type : {"Chief", "Worker"}) {
    json& args = job["spec"]["replicaSpecs"][type]["template"]["spec"]["containers"][0]["args"];
    json kept = json::array();
    for (const json& a : args) {
      if (a != "--set=supervisor.on_peer_loss=exit") kept.push_back(a);
    }
    args = kept;
  }
}

int serve_chief_metrics(json& job) {
  const int port = longhaul::testing::free_loopback_port();
  json& chief = job["spec"]["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0];
  chief["args"].push_back("--metrics-port=" + std::to_string(port));
  chief["ports"] = {{{"name", "metrics"}, {"containerPort", port}}};
  job["spec"]["progressIntervalSeconds"] = 5;
  return port;
}

std::vector<std::string> container_args(const json& job) {
  std::vector<std::string> args;
  for (const json& a :
       job["spec"]["replicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["args"]) {
    args.push_back(a.get<std::string>());
  }
  return args;
}

int64_t job_max_steps(const json& job) {
  int64_t steps = -1;
  const std::string key = "--set=training.max_steps=";
  for (const std::string& a : container_args(job)) {
    if (a.rfind(key, 0) == 0) steps = std::stoll(a.substr(key.size()));
  }
  return steps;
}

int64_t step_of(const std::string& checkpoint_path) {
  static const std::regex re(R"(-(\d+)(\.safetensors)?$)");
  std::smatch m;
  if (!std::regex_search(checkpoint_path, m, re)) return -1;
  return std::stoll(m[1].str());
}

fs::path checkpoint_file(const fs::path& logdir, const std::string& checkpoint_path) {
  fs::path p = fs::path(checkpoint_path).is_absolute() ? fs::path(checkpoint_path)
                                                       : logdir / checkpoint_path;
  if (p.extension() != ".safetensors") p += ".safetensors";
  return p;
}

std::optional<int64_t> latest_checkpoint_step(const fs::path& logdir) {
  try {
    auto state = supervisor::read_checkpoint_state(logdir);
    if (!state || state->model_checkpoint_path.empty()) return std::nullopt;
    return step_of(state->model_checkpoint_path);
  } catch (const std::exception&) {
    return std::nullopt;  // being rewritten: the next look sees it whole
  }
}

std::vector<int64_t> start_steps(const std::string& text) {
  static const std::regex re(R"((starting|resuming) at step (\d+)/)");
  std::vector<int64_t> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stoll((*it)[2].str()));
  }
  return out;
}

std::vector<int64_t> progress_steps(const std::string& text) {
  static const std::regex start(R"((starting|resuming) at step (\d+)/)");
  static const std::regex step(R"(^step +(\d+)/)");
  std::vector<int64_t> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    std::smatch m;
    if (std::regex_search(line, m, start)) {
      out.push_back(std::stoll(m[2].str()));
    } else if (std::regex_search(line, m, step)) {
      out.push_back(std::stoll(m[1].str()));
    }
    begin = end + 1;
  }
  return out;
}

std::string where_steps_go_back(const std::vector<int64_t>& steps) {
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i] < steps[i - 1]) {
      return std::to_string(steps[i]) + " after " + std::to_string(steps[i - 1]) + " (entry " +
             std::to_string(i) + ")";
    }
  }
  return "";
}

std::vector<int64_t> session_start_steps(const fs::path& logdir) {
  std::vector<std::pair<double, int64_t>> files;
  for (const fs::path& f : supervisor::list_events_files(logdir)) {
    // A process killed by SIGKILL may leave a torn last record: read up to it.
    supervisor::EventsReader reader(f);
    double first = -1;
    int64_t start = -1;
    try {
      while (auto e = reader.next_event()) {
        if (first < 0) first = e->wall_time();
        if (e->has_session_log() && e->session_log().status() == tensorboard::SessionLog::START) {
          start = e->step();
          break;
        }
      }
    } catch (const DataLoss& e) {
      ADD_FAILURE() << f << ": " << e.what() << " before its SessionLog START";
    }
    files.emplace_back(first, start);
  }
  std::sort(files.begin(), files.end());
  std::vector<int64_t> out;
  for (const auto& [t, s] : files) out.push_back(s);
  return out;
}

int run_worker(const fs::path& worker, const std::vector<std::string>& args, const fs::path& logdir,
               const fs::path& log, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {worker.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--logdir");
  argv.push_back(logdir.string());
  // The pods' host environment, not this test's: a host that exports OPENBLAS_CORETYPE (or any
  // variable the kubelet does not pass) must not give the reference other BLAS kernels.
  std::vector<std::string> env;
  for (const auto& [k, v] : kubelet::passed_host_environment(kubelet::CommandOptions{})) {
    env.push_back(k + "=" + v);
  }
  ChildProcess p(argv, log, env);
  auto code = p.wait(timeout);
  if (!code) {
    p.stop(std::chrono::seconds(1));
    return -1;
  }
  return *code;
}

std::optional<supervisor::CheckpointState> verified_final_checkpoints(const fs::path& logdir,
                                                                      int64_t max_steps) {
  auto state = supervisor::read_checkpoint_state(logdir);
  if (!state) {
    ADD_FAILURE() << "no checkpoint state file in " << logdir;
    return state;
  }
  EXPECT_EQ(step_of(state->model_checkpoint_path), max_steps);
  for (const std::string& p : state->all_model_checkpoint_paths) {
    supervisor::SafetensorsReader r(checkpoint_file(logdir, p));
    EXPECT_NO_THROW(r.verify_all()) << p;
  }
  return state;
}

void expect_matches_uninterrupted_run(const std::vector<std::string>& worker_args,
                                      const fs::path& work_dir, const fs::path& checkpoint,
                                      int64_t max_steps) {
  const fs::path reference = work_dir / "reference";
  const int code = run_worker(binary_dir() / "worker/cli/longhaul-worker", worker_args, reference,
                              work_dir / "reference.log", std::chrono::seconds(300));
  ASSERT_EQ(code, 0) << tail(work_dir / "reference.log", 3000);
  expect_same_tensors(checkpoint,
                      reference / ("model.ckpt-" + std::to_string(max_steps) + ".safetensors"));
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  supervisor::SafetensorsReader ra(a), rb(b);
  int compared = 0;
  for (const std::string& name : ra.tensor_names()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(rb.contains(name)) << b;
    const auto& sa = ra.spec(name);
    const auto& sb = rb.spec(name);
    ASSERT_EQ(sa.dtype, sb.dtype);
    ASSERT_EQ(sa.shape, sb.shape);
    const auto da = ra.data(name), db = rb.data(name);
    ASSERT_EQ(da.size(), db.size());
    if (sa.dtype == supervisor::DType::kF32) {
      const size_t n = da.size() / sizeof(float);
      size_t bad = 0;
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        float x, y;
        std::memcpy(&x, da.data() + i * sizeof(float), sizeof x);
        std::memcpy(&y, db.data() + i * sizeof(float), sizeof y);
        const double diff = std::fabs(static_cast<double>(x) - y);
        worst = std::max(worst, diff);
        if (diff > 1e-5 + 1e-5 * std::fabs(y)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << "elements differ beyond fp32 tolerance; worst |diff| " << worst;
    } else {
      EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size()), 0);
    }
    ++compared;
  }
  EXPECT_GT(compared, 0) << a << " holds no tensors";
}

}  // namespace longhaul::e2e::testing
