// Shared fixture for the fake API server tests: a started server on an ephemeral port and a
// blocking client, plus object builders.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <longhaul/fakeapi/server.h>

#include "test_http_client.h"

namespace longhaul::fakeapi::testing {

inline const std::string kPods = "/api/v1/namespaces/default/pods";
inline const std::string kJobs = "/apis/longhaul.dev/v1alpha1/namespaces/default/trainingjobs";

inline json pod(const std::string& name, json labels = json::object(),
                const std::string& node = "") {
  json p = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"labels", labels}}},
            {"spec", {{"containers", {{{"name", "main"}, {"image", "busybox:1.36"}}}}}}};
  if (!node.empty()) p["spec"]["nodeName"] = node;
  return p;
}

inline json training_job(const std::string& name) {
  return {{"apiVersion", "longhaul.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec", {{"replicaSpecs", {{"Worker", {{"replicas", 2}}}}}}}};
}

inline json owner_ref(const json& owner) {
  return {{"apiVersion", owner["apiVersion"]},
          {"kind", owner["kind"]},
          {"name", owner["metadata"]["name"]},
          {"uid", owner["metadata"]["uid"]},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

inline uint64_t rv_of(const json& object) {
  return std::stoull(object["metadata"]["resourceVersion"].get<std::string>());
}

class FakeApiTest : public ::testing::Test {
 protected:
  virtual Options options() {
    Options o;
    o.bookmark_interval = std::chrono::milliseconds(50);
    return o;
  }
  void SetUp() override {
    server_ = std::make_unique<FakeApiServer>(options());
    server_->start();
    client_ = std::make_unique<TestHttpClient>(server_->port(), options().bearer_token,
                                               server_->ca_file());
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
  }
  json create_pod(const std::string& name, json labels = json::object(),
                  const std::string& node = "") {
    Response r = client_->post(kPods, pod(name, std::move(labels), node));
    EXPECT_EQ(r.status, 201) << r.body;
    return r.json_body();
  }

  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<TestHttpClient> client_;
};

}  // namespace longhaul::fakeapi::testing
