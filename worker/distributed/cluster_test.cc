// TF_CONFIG parsing and replica resolution: table tests of ranks, world sizes and the errors
// that name the TF_CONFIG field.
#include "longhaul/distributed/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "longhaul/base/error.h"

namespace longhaul::dist {
namespace {

using ::testing::HasSubstr;

struct RankCase {
  std::string name;
  std::string tf_config;
  std::optional<int> rank;
  int world_size;
  bool is_chief;
  std::string host;
};

class RankTest : public ::testing::TestWithParam<RankCase> {};

TEST_P(RankTest, ResolvesRankWorldAndBindHost) {
  const RankCase& c = GetParam();
  ReplicaIdentity id = resolve_replica({{"TF_CONFIG", c.tf_config}});
  EXPECT_EQ(id.rank, c.rank);
  EXPECT_EQ(id.world_size, c.world_size);
  EXPECT_EQ(id.cluster.is_chief(), c.is_chief);
  EXPECT_EQ(id.bind_host, c.host);
  EXPECT_TRUE(id.from_tf_config);
}

const std::string kChiefAndTwoWorkers =
    R"("cluster": {"chief": ["j-chief-0.j.ns.svc:2222"],
                   "worker": ["j-worker-0.j.ns.svc:2222", "j-worker-1.j.ns.svc:2222"],
                   "ps": ["j-ps-0.j.ns.svc:2222"], "evaluator": ["j-evaluator-0.j.ns.svc:2222"]})";

INSTANTIATE_TEST_SUITE_P(
    TfConfig, RankTest,
    ::testing::Values(
        RankCase{"chief_is_rank0",
                 "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "chief", "index": 0}})", 0, 3,
                 true, "j-chief-0.j.ns.svc"},
        RankCase{"worker0_is_rank1_with_chief",
                 "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "worker", "index": 0}})", 1, 3,
                 false, "j-worker-0.j.ns.svc"},
        RankCase{"worker1_is_rank2",
                 "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "worker", "index": 1}})", 2, 3,
                 false, "j-worker-1.j.ns.svc"},
        RankCase{"ps_has_no_rank",
                 "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "ps", "index": 0}})",
                 std::nullopt, 3, false, ""},
        RankCase{"evaluator_outside_world",
                 "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "evaluator", "index": 0}})",
                 std::nullopt, 3, false, ""},
        RankCase{
            "worker0_is_chief_without_chief",
            R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})", 0,
            2, true, "a"},
        RankCase{
            "worker1_without_chief",
            R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})", 1,
            2, false, "b"},
        RankCase{
            "legacy_master_is_chief",
            R"({"cluster": {"master": ["m:1"], "worker": ["w:2"]}, "task": {"type": "master", "index": 0}})",
            0, 2, true, "m"},
        RankCase{
            "string_index_and_ipv6",
            R"({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]}, "task": {"type": "worker", "index": "1"}})",
            1, 2, false, "::1"}),
    [](const auto& info) { return info.param.name; });

struct BadCase {
  std::string name;
  std::string tf_config;
  std::string message;  // a substring naming the field
};

class BadTfConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadTfConfigTest, InvalidArgumentNamesTheField) {
  const BadCase& c = GetParam();
  try {
    parse_tf_config(c.tf_config);
    FAIL() << "accepted " << c.tf_config;
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(c.message));
  }
}

INSTANTIATE_TEST_SUITE_P(
    TfConfig, BadTfConfigTest,
    ::testing::Values(
        BadCase{"not_json", "{cluster", "TF_CONFIG is not valid JSON"},
        BadCase{"not_object", "[1]", "TF_CONFIG must be a JSON object"},
        BadCase{"no_cluster", R"({"task": {"type": "worker", "index": 0}})", "TF_CONFIG cluster"},
        BadCase{"no_task", R"({"cluster": {"worker": ["a:1"]}})", "TF_CONFIG task"},
        BadCase{"no_type", R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})",
                "TF_CONFIG task.type"},
        BadCase{"unknown_type",
                R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "trainer", "index": 0}})",
                "TF_CONFIG task.type 'trainer'"},
        BadCase{
            "index_out_of_range",
            R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})",
            "TF_CONFIG task.index 2 is outside cluster.worker, which has 2"},
        BadCase{"negative_index",
                R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})",
                "TF_CONFIG task.index -1"},
        BadCase{"index_not_int",
                R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1.5}})",
                "TF_CONFIG task.index must be an integer"},
        BadCase{
            "address_without_port",
            R"({"cluster": {"worker": ["a:1", "hostonly"]}, "task": {"type": "worker", "index": 0}})",
            "TF_CONFIG cluster.worker[1] 'hostonly' has no port"},
        BadCase{"address_not_string",
                R"({"cluster": {"worker": [7]}, "task": {"type": "worker", "index": 0}})",
                "TF_CONFIG cluster.worker[0] must be a \"host:port\" string"},
        BadCase{"list_not_array",
                R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})",
                "TF_CONFIG cluster.worker must be a list"},
        BadCase{"two_chiefs",
                R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})",
                "TF_CONFIG cluster.chief has 2 addresses"},
        BadCase{"unknown_cluster_key",
                R"({"cluster": {"workers": ["a:1"]}, "task": {"type": "worker", "index": 0}})",
                "TF_CONFIG cluster.workers is not a known task type"},
        BadCase{"empty_world",
                R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})",
                "neither chief nor worker"},
        BadCase{"evaluator_missing",
                R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}})",
                "TF_CONFIG task.index 0 is outside cluster.evaluator, which has 0"}),
    [](const auto& info) { return info.param.name; });

TEST(ResolveReplicaTest, HostOverrideReplacesEveryTfConfigHost) {
  ReplicaIdentity id = resolve_replica(
      {{"TF_CONFIG", "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "worker", "index": 1}})"},
       {"LONGHAUL_HOST_OVERRIDE", "127.0.0.1"},
       {"LONGHAUL_RESTART_ATTEMPT", "7"}});
  EXPECT_EQ(id.bind_host, "127.0.0.1");
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.attempt, "7");
}

TEST(ResolveReplicaTest, TaskAddressListPicksThisRanksHost) {
  ReplicaIdentity id = resolve_replica(
      {{"TF_CONFIG", "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "worker", "index": 0}})"},
       {"LONGHAUL_TASK_ADDRESSES", "127.0.0.1,127.0.0.2,127.0.0.3"},
       {"LONGHAUL_HOST_OVERRIDE", "10.0.0.1"}});
  EXPECT_EQ(id.bind_host, "127.0.0.2");
}

TEST(ResolveReplicaTest, TaskAddressListOfWrongLengthIsRejected) {
  EXPECT_THROW(resolve_replica({{"TF_CONFIG", "{" + kChiefAndTwoWorkers +
                                                  R"(, "task": {"type": "chief", "index": 0}})"},
                                {"LONGHAUL_TASK_ADDRESSES", "127.0.0.1"}}),
               InvalidArgument);
}

TEST(ResolveReplicaTest, ExplicitFlagsWithoutTfConfig) {
  ReplicaIdentity id = resolve_replica({}, ExplicitReplica{.rank = 2, .world_size = 3});
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.world_size, 3);
  EXPECT_EQ(id.bind_host, "127.0.0.1");
  EXPECT_FALSE(id.cluster.is_chief());
  EXPECT_EQ(id.cluster.rank(), 2);
}

TEST(ResolveReplicaTest, EnvironmentRankWithoutTfConfig) {
  ReplicaIdentity id = resolve_replica({{"LONGHAUL_RANK", "0"}, {"LONGHAUL_WORLD_SIZE", "2"}});
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.world_size, 2);
  EXPECT_TRUE(id.cluster.is_chief());
}

TEST(ResolveReplicaTest, DefaultsToASingleReplica) {
  ReplicaIdentity id = resolve_replica({});
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.world_size, 1);
  EXPECT_EQ(id.attempt, "0");
}

TEST(ResolveReplicaTest, RankOutsideWorldIsRejected) {
  try {
    resolve_replica({}, ExplicitReplica{.rank = 3, .world_size = 3});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("outside the world size 3"));
  }
  EXPECT_THROW(resolve_replica({{"LONGHAUL_RANK", "x"}}), InvalidArgument);
}

TEST(ResolveReplicaTest, FlagsContradictingTfConfigAreRejected) {
  const std::string cfg =
      "{" + kChiefAndTwoWorkers + R"(, "task": {"type": "worker", "index": 1}})";
  EXPECT_THROW(resolve_replica({{"TF_CONFIG", cfg}}, ExplicitReplica{.rank = 1}), InvalidArgument);
  EXPECT_THROW(resolve_replica({{"TF_CONFIG", cfg}}, ExplicitReplica{.world_size = 2}),
               InvalidArgument);
  EXPECT_NO_THROW(
      resolve_replica({{"TF_CONFIG", cfg}}, ExplicitReplica{.rank = 2, .world_size = 3}));
}

TEST(ResolveReplicaTest, AttemptMustBeAPlainFolderName) {
  EXPECT_THROW(resolve_replica({{"LONGHAUL_RESTART_ATTEMPT", "../x"}}), InvalidArgument);
}

TEST(ClusterSpecTest, RankNamesAndAddresses) {
  ClusterSpec spec =
      parse_tf_config("{" + kChiefAndTwoWorkers + R"(, "task": {"type": "chief", "index": 0}})");
  EXPECT_EQ(spec.rank_name(0), "chief 0");
  EXPECT_EQ(spec.rank_name(2), "worker 1");
  EXPECT_EQ(spec.address_of_rank(1), "j-worker-0.j.ns.svc:2222");
  EXPECT_EQ(spec.ps.size(), 1u);
  EXPECT_EQ(spec.evaluator.size(), 1u);
}

}  // namespace
}  // namespace longhaul::dist
