// The one spelling of a request path that every route lookup and check reads.
//
// A path may name the same resource in many spellings: percent-encoded bytes ("/start%5Fprofile",
// "/%73tart_profile"), duplicate slashes ("//start_profile"), dot segments ("/v1/./x",
// "/x/../start_profile"). A server behind pdrouter decodes those before it routes (Starlette, which
// vLLM's API server runs on, routes on the percent-decoded path), so a check that reads the raw
// bytes would see a different path than the node that acts on it. normalize_path() turns the raw
// path into one canonical spelling; encode_path() spells that back for the wire, so what a node
// gets is what pdrouter checked.
//
// Refused (kInvalidValue, the message says which): a path that does not start with '/' (the
// asterisk and absolute forms), an escape that is not '%' and two hex digits, an encoded '/'
// ("%2F": it would join or split segments depending on who decodes), a decoded byte outside
// printable ASCII (NUL and the other control bytes, DEL, bytes >= 0x80), and ".." above the root.
//
// Pure functions, no I/O.
#pragma once

#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::http {

// `raw`: the request target up to '?' as received. On success `*out` is the decoded path with
// "." segments and empty segments (duplicate slashes) dropped and ".." resolved; it starts with
// '/', and keeps one trailing '/' when `raw` ended with one ("/" stays "/"). `*out` is untouched
// on error.
Status normalize_path(std::string_view raw, std::string* out);

// A normalised path spelled for a request line: every byte outside RFC 3986's unreserved set,
// sub-delims, ':', '@' and '/' percent-encoded (so '%', '?', '#' and ' ' never change meaning).
std::string encode_path(std::string_view path);

}  // namespace pdr::http
