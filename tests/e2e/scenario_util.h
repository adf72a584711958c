// Helpers of the end-to-end scenarios: where the binaries are, the tiny example job, logdir
// readers (state file, checkpoints, events files) and the comparison of two checkpoints.
//
// Thread-safety: used from the test thread only.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <longhaul/supervisor/checkpoint_state.h>

namespace longhaul::e2e::testing {

using json = nlohmann::json;
namespace fs = std::filesystem;

inline constexpr const char* kJobs = "trainingjobs.longhaul.dev";

fs::path binary_dir();  // $LONGHAUL_BINARY_DIR
fs::path source_dir();  // $LONGHAUL_SOURCE_DIR
std::string read_text(const fs::path& path);
std::string tail(const fs::path& path, size_t bytes);

// The TrainingJob of examples/trainingjob-tiny.yaml, without its Worker replicas unless
// `with_worker`, with nodeLostTimeoutSeconds 1 so a lost node costs seconds, not minutes.
json tiny_job(bool with_worker);
// Both templates' pods get a 5 s grace period (a lost pod is deleted with it, then force-deleted
// nodeLostTimeoutSeconds later), and their workers a grace_period_secs of 4 to fit inside it.
void set_grace_period_5s(json& job);
// Drops --set=supervisor.on_peer_loss=exit from both templates: workers regroup in place when a
// peer is lost (the worker's default).
void regroup_on_peer_loss(json& job);
// The chief serves its metrics on a free local port declared as its `metrics` container port (the
// local kubelet does not rewrite literal ports; only the chief serves, so no two pods collide),
// and the operator reads its progress into status.progress every 5 s. Returns the port.
int serve_chief_metrics(json& job);
// The first container's args of the Chief template, and the max_steps they set.
std::vector<std::string> container_args(const json& job);
int64_t job_max_steps(const json& job);

// "model.ckpt-120" (or with .safetensors) -> 120; -1 when it does not parse.
int64_t step_of(const std::string& checkpoint_path);
fs::path checkpoint_file(const fs::path& logdir, const std::string& checkpoint_path);
// The step of the checkpoint the state file names; nullopt when there is none yet.
std::optional<int64_t> latest_checkpoint_step(const fs::path& logdir);
// The N of every "starting at step N/" / "resuming at step N/" in a worker's output, in order.
std::vector<int64_t> start_steps(const std::string& text);
// The training step of every progress line of a worker's output, in order: "starting/resuming at
// step N/", "step N/M | ..." (a pod log holds every incarnation of the pod, one after the other).
std::vector<int64_t> progress_steps(const std::string& text);
// Where `steps` goes back ("12 after 40 (entry 7)"); empty when it never does.
std::string where_steps_go_back(const std::vector<int64_t>& steps);
// The SessionLog START step of each events file of the logdir, files in the order they were
// started (their first event's wall time); -1 for a file without START.
std::vector<int64_t> session_start_steps(const fs::path& logdir);

// Runs longhaul-worker with `args` and --logdir `logdir` to completion, in the environment the
// local kubelet gives its pods (kubelet::passed_host_environment), so that its results compare
// with a pod's bit for bit; returns the exit code (-1 on timeout, after killing it).
int run_worker(const fs::path& worker, const std::vector<std::string>& args, const fs::path& logdir,
               const fs::path& log, std::chrono::milliseconds timeout);

// The logdir of a job that succeeded: the state file names checkpoint `max_steps`, and every
// checkpoint it retains verifies. nullopt (and a test failure) without a state file.
std::optional<supervisor::CheckpointState> verified_final_checkpoints(const fs::path& logdir,
                                                                      int64_t max_steps);

// The same training run straight through, never disrupted: longhaul-worker `worker_args` into
// `work_dir`/reference (its output in `work_dir`/reference.log); its final checkpoint must hold
// the same tensors as `checkpoint`. A failed reference run is a fatal failure.
void expect_matches_uninterrupted_run(const std::vector<std::string>& worker_args,
                                      const fs::path& work_dir, const fs::path& checkpoint,
                                      int64_t max_steps);

// Every tensor of `a` is in `b` with the same dtype and shape, and F32 values agree within
// 1e-5 absolute + 1e-5 relative (fp32 rounding); other dtypes byte for byte.
void expect_same_tensors(const fs::path& a, const fs::path& b);

}  // namespace longhaul::e2e::testing
