// The one JSON text writer of the project (inspection output: CPU descriptor,
// overrides, explain / info / stats, the instruction-count tool). Torch-free,
// so the kernels library and the op layer (ops/impl) both use it. The Python
// layer parses the text with json.loads.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace torchao_kernels {

// s as a JSON string literal: '"' and '\\' escaped, the control characters
// (U+0000..U+001F, U+007F) as their short forms or \u00XX; other bytes
// (UTF-8 sequences) are copied.
inline std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o + "\"";
}

inline std::string json_bool(bool b) { return b ? "true" : "false"; }

// [a, b, ...] from already-encoded values.
inline std::string json_list(const std::vector<std::string>& items) {
  std::string o = "[";
  for (size_t i = 0; i < items.size(); ++i) o += (i ? ", " : "") + items[i];
  return o + "]";
}

// Builds {"key": value, ...}; raw() takes an already-encoded value.
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

}  // namespace torchao_kernels
