// A JSON string literal of `s` (control characters as spaces): what the emulator's
// programs write their reports and results in. Header-only, so that
// xsim-conformance, which runs against the real CUDA libraries too, can use it.
#pragma once

#include <string>

namespace xsim {

inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace xsim
