// The one JSON reader of the project: parses tuning tables (files a user may
// have edited, truncated or received from elsewhere). Strict and bounded, so
// hostile input can only be rejected, never crash or exhaust memory: nesting
// depth, string length, member count and total size are limited, numbers are
// parsed from a bounded token, and every failure names its byte offset.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace torchao_kernels {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> items;                              // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in file order

  bool is_object() const { return type == Type::kObject; }
  bool is_string() const { return type == Type::kString; }
  bool is_number() const { return type == Type::kNumber; }
  // The member named key (the last one if repeated), or nullptr.
  const JsonValue* get(const std::string& key) const;
};

struct JsonLimits {
  size_t max_bytes = 16u << 20;
  int max_depth = 32;
  size_t max_string = 4096;
  size_t max_items = 1u << 20;  // array items and object members, in total
};

// Parses one JSON document (RFC 8259; \u escapes are decoded to UTF-8).
// Returns false and sets error ("... at byte N") on malformed input or when a
// limit is exceeded; out is then unspecified.
bool parse_json(const std::string& text, JsonValue& out, std::string& error,
                const JsonLimits& limits = JsonLimits());

}  // namespace torchao_kernels
