// `longhaul-worker doctor` on a machine without a usable GPU (CUDA_VISIBLE_DEVICES="" hides any,
// so this holds on GPU machines too): it says so plainly, checks the CPU path (threads, BLAS,
// vector ISA, every CPU kernel against the reference, a matmul measurement), names the path
// `train` would take, and its --json output parses with the same facts. --device cuda without
// a GPU is a clear usage error (exit 2).
#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const std::map<std::string, std::string> kNoGpu = {{"CUDA_VISIBLE_DEVICES", ""}};

class WorkerDoctorTest : public ::testing::Test {
 protected:
  longhaul::testing::TestTempDir dir_{"worker_doctor"};
};

TEST_F(WorkerDoctorTest, WithoutAGpuSaysSoAndChecksTheCpuPath) {
  const RunOutput r = run_worker({"doctor"}, dir_, 120s, kNoGpu);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"Build\n  CUDA backend", "GPU\n  driver", "NO USABLE GPU: ",
                           "=> checking the CPU path instead", "CPU\n  processor", "  threads  ",
                           "  BLAS  ", "  vector ISA  ", "  fp32 matmul 1024^3 ", " GFLOP/s (",
                           "CPU self-check (B=2 T=80 C=64 NH=2 HS=32 V=256)",
                           "Chosen path: device cpu (", "All checks passed."}) {
    EXPECT_TRUE(contains(r.out, line)) << "missing '" << line << "' in\n" << r.out;
  }
  // Every CPU kernel family, each PASS with its error against its tolerance.
  for (const char* family :
       {"embedding", "layernorm+residual", "matmul.bias", "matmul.gelu", "matmul.backward",
        "matmul.classifier", "attention", "gelu", "classifier", "adamw", "global_norm"}) {
    EXPECT_TRUE(contains(r.out, std::string("\n") + family + std::string(20 - strlen(family), ' ') +
                                    " cpu                PASS"))
        << family << " in\n"
        << r.out;
  }
  EXPECT_TRUE(contains(r.out, " / 1.0e-05")) << r.out;
}

TEST_F(WorkerDoctorTest, JsonParsesAndCarriesTheSameFacts) {
  const RunOutput r =
      run_worker({"doctor", "--json", "--set", "model.preset=gpt2-124m"}, dir_, 120s, kNoGpu);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // throws (fails) on anything else
  EXPECT_FALSE(j.at("gpu").at("usable").get<bool>());
  EXPECT_FALSE(j.at("gpu").at("reason").get<std::string>().empty());
  EXPECT_GE(j.at("cpu").at("threads").get<int>(), 1);
  EXPECT_FALSE(j.at("cpu").at("blas").get<std::string>().empty());
  EXPECT_FALSE(j.at("cpu").at("isa").get<std::string>().empty());
  EXPECT_GT(j.at("cpu").at("matmul_fp32_gflops").get<double>(), 0.0);
  const auto& check = j.at("cpu").at("self_check");
  EXPECT_TRUE(check.at("passed").get<bool>());
  // The model's real head size: gpt2-124m has 64.
  EXPECT_EQ(check.at("shape").get<std::string>(), "B=2 T=80 C=128 NH=2 HS=64 V=300");
  ASSERT_EQ(check.at("families").size(), 11u);
  for (const auto& family : check.at("families")) {
    EXPECT_EQ(family.at("status"), "PASS") << family.dump();
    for (const auto& output : family.at("attempts").at(0).at("outputs")) {
      EXPECT_LE(output.at("error").get<double>(), output.at("tolerance").get<double>())
          << family.dump();
    }
  }
  EXPECT_EQ(j.at("chosen").at("device"), "cpu");
  EXPECT_TRUE(j.at("passed").get<bool>());
  EXPECT_TRUE(j.at("build").contains("cuda_architectures"));
}

TEST_F(WorkerDoctorTest, DeviceCudaWithoutAGpuIsAUsageErrorAndDeviceCpuSkipsTheGpu) {
  const RunOutput cuda = run_worker({"doctor", "--device", "cuda"}, dir_, 120s, kNoGpu);
  EXPECT_EQ(cuda.exit_code, 2) << cuda.out << cuda.err;
  EXPECT_TRUE(contains(cuda.err, "doctor --device cuda: no usable GPU: ")) << cuda.err;
  EXPECT_TRUE(contains(cuda.err, "--device cpu")) << cuda.err;

  const RunOutput cpu = run_worker({"doctor", "--device", "cpu"}, dir_, 120s, kNoGpu);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  EXPECT_TRUE(contains(cpu.out, "Chosen path: device cpu (--device cpu)")) << cpu.out;
  EXPECT_FALSE(contains(cpu.out, "=> checking the CPU path instead")) << cpu.out;

  const RunOutput bad = run_worker({"doctor", "--device", "tpu"}, dir_, 120s, kNoGpu);
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;

  const RunOutput help = run_worker({"doctor", "--help"}, dir_);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "--json")) << help.out;
  const RunOutput top = run_worker({"--help"}, dir_);
  EXPECT_TRUE(contains(top.out, "doctor")) << top.out;
  EXPECT_TRUE(contains(top.out, "5 numerical fault")) << top.out;
}

}  // namespace
}  // namespace longhaul::worker_test
