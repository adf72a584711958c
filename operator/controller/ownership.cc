// The controller ownerReference walk (see ownership.h).
#include "longhaul/controller/ownership.h"

#include "longhaul/api/trainingjob.h"

namespace longhaul::controller {

using json = nlohmann::json;

const json* controlling_job_reference(const json& object) {
  const json& md = object.at("metadata");
  const auto refs = md.find("ownerReferences");
  if (refs == md.end() || !refs->is_array()) return nullptr;
  for (const json& ref : *refs) {
    if (ref.value("controller", false) && ref.value("kind", "") == api::kKind) return &ref;
  }
  return nullptr;
}

bool controlled_by_job(const json& object, const std::string& job_uid,
                       const std::string& job_name) {
  const json* ref = controlling_job_reference(object);
  if (ref == nullptr) return false;
  return !job_uid.empty() ? ref->value("uid", "") == job_uid : ref->value("name", "") == job_name;
}

}  // namespace longhaul::controller
