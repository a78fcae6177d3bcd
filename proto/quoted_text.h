// Private helper for proto/ error messages: renders untrusted text safely inside a Status message.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pdr::proto {

// Returns text in single quotes, cut to at most max_chars input bytes (then "..." is appended
// inside the quotes), with every byte outside printable ASCII, plus ' and \, written as \xNN so a
// hostile value cannot forge log lines or terminal escapes.
std::string quote_untrusted(std::string_view text, size_t max_chars = 64);

}  // namespace pdr::proto
