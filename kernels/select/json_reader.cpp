#include "kernels/select/json_reader.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace torchao_kernels {

const JsonValue* JsonValue::get(const std::string& key) const {
  const JsonValue* found = nullptr;
  if (type != Type::kObject) return nullptr;
  for (const auto& m : members)
    if (m.first == key) found = &m.second;
  return found;
}

namespace {

class Parser {
 public:
  Parser(const std::string& s, const JsonLimits& lim) : s_(s), lim_(lim) {}

  bool document(JsonValue& out, std::string& error) {
    if (s_.size() > lim_.max_bytes) return fail("document larger than " + std::to_string(lim_.max_bytes) + " bytes", error);
    ws();
    if (!value(out, 0)) return fail(err_, error);
    ws();
    if (i_ != s_.size()) return fail("trailing characters", error);
    return true;
  }

 private:
  bool fail(const std::string& what, std::string& error) {
    error = what + " at byte " + std::to_string(i_);
    return false;
  }
  bool bad(const char* what) {
    err_ = what;
    return false;
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(i_, n, word) != 0) return bad("invalid literal");
    i_ += n;
    return true;
  }
  bool count_item() {
    if (++items_ > lim_.max_items) return bad("too many array items or object members");
    return true;
  }

  bool value(JsonValue& v, int depth) {
    if (depth > lim_.max_depth) return bad("nesting too deep");
    if (i_ >= s_.size()) return bad("unexpected end of input");
    const char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.type = JsonValue::Type::kString;
      return string(v.string);
    }
    if (c == 't' || c == 'f') {
      v.type = JsonValue::Type::kBool;
      v.boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v.type = JsonValue::Type::kNull;
      return literal("null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(v);
    return bad("unexpected character");
  }

  bool object(JsonValue& v, int depth) {
    v.type = JsonValue::Type::kObject;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      if (i_ >= s_.size() || s_[i_] != '"') return bad("expected a member name");
      std::string key;
      if (!string(key)) return false;
      ws();
      if (i_ >= s_.size() || s_[i_] != ':') return bad("expected ':'");
      ++i_;
      ws();
      if (!count_item()) return false;
      v.members.emplace_back(std::move(key), JsonValue());
      if (!value(v.members.back().second, depth + 1)) return false;
      ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return bad("expected ',' or '}'");
    }
  }

  bool array(JsonValue& v, int depth) {
    v.type = JsonValue::Type::kArray;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      if (!count_item()) return false;
      v.items.emplace_back();
      if (!value(v.items.back(), depth + 1)) return false;
      ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return bad("expected ',' or ']'");
    }
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  bool hex4(unsigned& out) {
    if (i_ + 4 > s_.size()) return bad("truncated \\u escape");
    out = 0;
    for (int j = 0; j < 4; ++j) {
      const int h = hex(s_[i_ + j]);
      if (h < 0) return bad("invalid \\u escape");
      out = out * 16 + static_cast<unsigned>(h);
    }
    i_ += 4;
    return true;
  }

  static void utf8(unsigned cp, std::string& o) {
    if (cp < 0x80) {
      o += static_cast<char>(cp);
    } else if (cp < 0x800) {
      o += static_cast<char>(0xC0 | (cp >> 6));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += static_cast<char>(0xE0 | (cp >> 12));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (cp >> 18));
      o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool string(std::string& o) {
    ++i_;  // opening quote
    while (true) {
      if (i_ >= s_.size()) return bad("unterminated string");
      if (o.size() > lim_.max_string) return bad("string too long");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return bad("control character in string");
      if (c != '\\') {
        o += static_cast<char>(c);
        ++i_;
        continue;
      }
      if (++i_ >= s_.size()) return bad("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': o += '"'; break;
        case '\\': o += '\\'; break;
        case '/': o += '/'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          unsigned cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate needs its low half
            unsigned lo;
            if (s_.compare(i_, 2, "\\u") != 0) return bad("unpaired surrogate");
            i_ += 2;
            if (!hex4(lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return bad("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return bad("unpaired surrogate");
          }
          utf8(cp, o);
          break;
        }
        default:
          return bad("invalid escape");
      }
    }
  }

  bool number(JsonValue& v) {
    const size_t start = i_;
    if (s_[i_] == '-') ++i_;
    auto digits = [&] {
      const size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > d;
    };
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (!digits()) {
      return bad("invalid number");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) return bad("invalid number");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return bad("invalid number");
    }
    if (i_ - start > 64) return bad("number too long");
    v.type = JsonValue::Type::kNumber;
    // from_chars: independent of the process locale (strtod is not).
    const auto r = std::from_chars(s_.data() + start, s_.data() + i_, v.number);
    if (r.ec != std::errc() || !std::isfinite(v.number)) return bad("number out of range");
    return true;
  }

  const std::string& s_;
  const JsonLimits& lim_;
  size_t i_ = 0;
  size_t items_ = 0;
  std::string err_;
};

}  // namespace

bool parse_json(const std::string& text, JsonValue& out, std::string& error, const JsonLimits& limits) {
  out = JsonValue();
  Parser p(text, limits);
  return p.document(out, error);
}

}  // namespace torchao_kernels
