// longhaul-envtest: starts a real Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager) on loopback with the TrainingJob CRD installed, prints how to reach
// it, and keeps it up until SIGINT/SIGTERM; then stops every process and removes its data.
// For developers (`kubectl --kubeconfig ...` against a real API server in seconds) and for test
// drivers in other languages (--info-file is written once the plane is ready).
//
//   longhaul-envtest [--no-crds] [--crd FILE]... [--info-file F] [--kubeconfig-out F]
//                    [--apiserver-flag FLAG]...
#include <csignal>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "longhaul/base/file.h"
#include "longhaul/envtest/control_plane.h"

namespace envtest = longhaul::envtest;

int main(int argc, char** argv) {
  CLI::App app{
      "Start a real Kubernetes API server (etcd + kube-apiserver + "
      "kube-controller-manager) on loopback for tests and development; Ctrl-C stops it."};
  bool no_crds = false;
  std::string info_file;
  std::string kubeconfig_out;
  std::vector<std::string> extra_crds;
  std::vector<std::string> apiserver_flags;
  app.add_flag("--no-crds", no_crds, "do not install the TrainingJob CRD from crds/");
  app.add_option("--crd", extra_crds,
                 "also install this CRD manifest before the controller manager starts "
                 "(repeatable)")
      ->check(CLI::ExistingFile);
  app.add_option("--info-file", info_file,
                 "write {server, kubeconfig, caFile, workDir, pids} as JSON here once ready");
  app.add_option("--kubeconfig-out", kubeconfig_out, "also copy the admin kubeconfig to this path");
  app.add_option("--apiserver-flag", apiserver_flags,
                 "pass this flag to kube-apiserver, e.g. --apiserver-flag=--audit-policy-file=F "
                 "(repeatable)")
      ->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);

  // Block the stop signals before any thread or child exists; the children unblock them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::string why;
  const auto assets = envtest::find_assets(&why);
  if (!assets) {
    std::cerr << "longhaul-envtest: " << why << "\n";
    return 2;
  }
  std::unique_ptr<envtest::ControlPlane> plane;
  try {
    std::cerr << "longhaul-envtest: starting etcd, kube-apiserver and kube-controller-manager from "
              << assets->origin.string() << " ...\n";
    envtest::ControlPlaneOptions options;
    options.extra_apiserver_flags = apiserver_flags;
    plane = envtest::ControlPlane::start(*assets, options);
    if (!no_crds) {
      for (const auto& entry :
           std::filesystem::directory_iterator(envtest::source_dir() / "crds")) {
        if (entry.path().extension() == ".yaml") plane->install_crd(entry.path());
      }
    }
    if (!kubeconfig_out.empty()) {
      longhaul::file::write_atomically(kubeconfig_out,
                                       longhaul::file::read_file(plane->admin_kubeconfig()));
    }
    if (!info_file.empty()) {
      nlohmann::json info = {{"server", plane->server()},
                             {"kubeconfig", plane->admin_kubeconfig().string()},
                             {"caFile", plane->ca_file().string()},
                             {"workDir", plane->work_dir().string()},
                             {"pids", plane->pids()}};
      longhaul::file::write_atomically(info_file, info.dump(2) + "\n");
    }
  } catch (const std::exception& e) {
    std::cerr << "longhaul-envtest: " << e.what() << "\n";
    return 1;
  }
  std::cout << "longhaul-envtest: ready at " << plane->server() << " (data in "
            << plane->work_dir().string() << "); Ctrl-C stops it\n"
            << "export KUBECONFIG=" << plane->admin_kubeconfig().string() << "\n"
            << std::flush;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "longhaul-envtest: signal " << sig << ", stopping\n";
  plane->stop();
  return 0;
}
