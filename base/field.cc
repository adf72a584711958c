// Field paths and field errors (see field.h).
#include "longhaul/base/field.h"

#include "longhaul/base/error.h"

namespace longhaul::field {

std::string path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string out(parent);
  out += '.';
  out += key;
  return out;
}

std::string element(std::string_view parent, size_t index) {
  return std::string(parent) + "[" + std::to_string(index) + "]";
}

void fail(std::string_view where, std::string_view what) {
  throw InvalidArgument(std::string(where) + ": " + std::string(what));
}

}  // namespace longhaul::field
