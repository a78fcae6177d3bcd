// Secrets a topology names rather than contains: `*_env` keys (an environment variable) and
// `api_key_file` (a one-line file). A secret's value never reaches an error message; only the
// variable name or the file path does.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "discovery/config/yaml_reader.h"
#include "proto/base/status.h"

namespace pdr::config {

// Reads a regular file of at most `limit` bytes into *out without blocking on a FIFO. kIoError
// ("cannot open: ...", "not a regular file", "cannot read: ...") or kTooLarge; the message does not
// name the file.
Status read_small_file(const std::string& path, size_t limit, std::string* out);

// Reads map key `key` through `r` as the name of an environment variable holding a secret. The
// variable must be set, non-empty and free of control characters; then *env_name gets the name and
// *secret the value. An empty name means "no secret" and leaves both untouched. Errors are recorded
// in `r`.
void read_env_secret(const yaml::Source& src, yaml::MapReader& r, std::string_view key,
                     std::string* env_name, std::string* secret);

// Reads map key `key` through `r` as a path to a file holding a one-line secret (at most 4096
// bytes; a trailing line ending is stripped). A relative path resolves beside src.filename. On
// success *file gets the path as written and *secret the content. An empty path means "no secret".
// Errors are recorded in `r`.
void read_file_secret(const yaml::Source& src, yaml::MapReader& r, std::string_view key,
                      std::string* file, std::string* secret);

// Reads map key `key` through `r` as a path to a text file of at most `limit` bytes (relative paths
// resolve beside src.filename) and hands the content to `use(field, text)`, whose Status is kept.
// An empty path means "none". On success *file gets the path as written.
void read_text_file(const yaml::Source& src, yaml::MapReader& r, std::string_view key, size_t limit,
                    std::string* file,
                    const std::function<Status(const yaml::Field&, std::string_view)>& use);

}  // namespace pdr::config
