// Kubernetes' own syntax rules (apimachinery validation, v1.26) for what the operator puts into
// the pods, Service and claim it creates, so that a TrainingJob the API server would refuse at
// pod creation fails with InvalidSpec before any pod is created, naming the TrainingJob field
// and what to change.
//
// validate_pod_template() checks a replica's template as the API server checks a pod built from
// it: container and volume names (DNS-1123 labels, unique), images, port names (IANA_SVC_NAME,
// unique in the pod), port numbers and protocols, environment variable names, resource names and
// quantities (requests <= limits; extended resources whole and requests == limits), volume
// mounts (a known volume, unique absolute paths, no clash with the logdir mount), label and
// annotation keys and values, nodeSelector, serviceAccountName, imagePullPolicy. It throws
// longhaul::InvalidArgument "<path>: <what is wrong>: <what to change>", where path is the
// TrainingJob field, e.g. "spec.replicaSpecs.Worker.template.spec.containers[0].ports[1].name".
//
// The predicates are the API server's (k8s.io/apimachinery/pkg/util/validation).
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace longhaul::api {

struct LogdirSpec;

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters.
bool is_dns1123_label(std::string_view s);
// DNS-1123 labels joined by '.', at most 253 characters.
bool is_dns1123_subdomain(std::string_view s);
// At most 15 of [-a-z0-9], at least one letter, no '-' at either end, no "--".
bool is_iana_svc_name(std::string_view s);
// [-._a-zA-Z][-._a-zA-Z0-9]*
bool is_env_var_name(std::string_view s);
// At most 63 of [-A-Za-z0-9_.], starting and ending alphanumeric, or empty.
bool is_label_value(std::string_view s);
// [prefix/]name: prefix a DNS-1123 subdomain, name at most 63 of [-A-Za-z0-9_.] starting and
// ending alphanumeric.
bool is_qualified_name(std::string_view s);
// The value of a resource.Quantity ("500m", "1.5Gi", "2e3"), or nullopt when it does not parse.
std::optional<long double> parse_quantity(std::string_view s);

// Throws InvalidArgument naming `path` + the field. `template_json` is a PodTemplateSpec.
void validate_pod_template(const nlohmann::json& template_json, const std::string& path,
                           const LogdirSpec& logdir);

// The kubelet kills a pod's containers terminationGracePeriodSeconds (default 30) after its
// SIGTERM; a longhaul worker writes its final checkpoint and exits within its own
// grace_period_secs. A container of `template_json` that sets grace_period_secs on its command
// line (`--set=grace_period_secs=N` or `--set grace_period_secs=N`, in command or args) must
// set it below the pod's terminationGracePeriodSeconds, or the final checkpoint is cut short;
// throws InvalidArgument naming both fields and what to change. (A value in a config file is
// not seen here.)
void validate_grace_period(const nlohmann::json& template_json, const std::string& path);

}  // namespace longhaul::api
