// longhaul-fake-apiserver: the fake Kubernetes API server as a process, for local demos (the
// local kubelet and the operator point at it through the kubeconfig it writes).
//
//   longhaul-fake-apiserver --port 6443 --kubeconfig-out /tmp/demo/kubeconfig [--token T] [--tls]
//
// Prints the URL on stdout, serves until SIGTERM or SIGINT, then stops cleanly (exit 0).
#include <csignal>
#include <iostream>

#include <CLI/CLI.hpp>
#include <pthread.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/fakeapi/server.h>

int main(int argc, char** argv) {
  CLI::App app{"Fake Kubernetes API server for longhaul's local demos and tests"};
  longhaul::fakeapi::Options options;
  std::string kubeconfig_out;
  std::string kubeconfig_namespace = "default";
  std::string default_node;
  int bookmark_seconds = 60;
  app.add_option("--port", options.port, "TCP port (0 picks a free one)")->capture_default_str();
  app.add_option("--address", options.bind_address, "address to bind")->capture_default_str();
  app.add_option("--kubeconfig-out", kubeconfig_out,
                 "write a kubeconfig pointing at this server to this file");
  app.add_option("--namespace", kubeconfig_namespace, "namespace of the kubeconfig's context")
      ->capture_default_str();
  app.add_option("--token", options.bearer_token,
                 "require 'Authorization: Bearer <token>' on every API request");
  app.add_flag("--tls", options.tls.enabled,
               "serve HTTPS with a generated CA (embedded in the kubeconfig)");
  app.add_option("--tls-dir", options.tls.cert_dir,
                 "where to write ca.crt, server.crt, server.key (default: a temp dir)");
  app.add_option("--bookmark-interval", bookmark_seconds, "seconds between watch BOOKMARK events")
      ->capture_default_str();
  app.add_option("--default-node", default_node,
                 "schedule new pods onto this node name (act as the scheduler)");
  CLI11_PARSE(app, argc, argv);
  options.bookmark_interval = std::chrono::seconds(bookmark_seconds);
  options.default_node_name = default_node;

  // Block the stop signals in every thread; the main thread waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  try {
    longhaul::fakeapi::FakeApiServer server(options);
    server.start();
    if (!kubeconfig_out.empty()) server.write_kubeconfig(kubeconfig_out, kubeconfig_namespace);
    std::cout << server.url() << std::endl;
    int received = 0;
    sigwait(&signals, &received);
    LH_LOG(INFO) << "fake API server stopping" << longhaul::kv("signal", received);
    server.stop();
  } catch (const longhaul::Error& e) {
    std::cerr << "longhaul-fake-apiserver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
