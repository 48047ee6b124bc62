// Minimal JSON text building for the inspection entry points (explain, info,
// stats). The Python layer parses the text with json.loads.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace torchao_kernels {
namespace ops {

inline std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (c == '\n') {
      o += "\\n";
    } else {
      o += c;
    }
  }
  return o + "\"";
}

inline std::string json_bool(bool b) { return b ? "true" : "false"; }

inline std::string json_list(const std::vector<std::string>& items) {
  std::string o = "[";
  for (size_t i = 0; i < items.size(); ++i) o += (i ? ", " : "") + items[i];
  return o + "]";
}

// Builds {"key": value, ...} from already-encoded values.
class JsonObject {
 public:
  JsonObject& raw(const std::string& key, const std::string& encoded) {
    os_ << (first_ ? "" : ", ") << json_str(key) << ": " << encoded;
    first_ = false;
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& v) { return raw(key, json_str(v)); }
  template <class T>
  JsonObject& num(const std::string& key, T v) {
    std::ostringstream o;
    o << v;
    return raw(key, o.str());
  }
  JsonObject& boolean(const std::string& key, bool v) { return raw(key, json_bool(v)); }
  std::string done() const { return "{" + os_.str() + "}"; }

 private:
  std::ostringstream os_;
  bool first_ = true;
};

}  // namespace ops
}  // namespace torchao_kernels
