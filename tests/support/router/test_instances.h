// Registry instances for routing tests that build snapshots by hand: one node at `host`:8000
// (its key), of `role` and `connector`, with optional labels and declared model.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "discovery/instance.h"

namespace pdr::test {

inline std::shared_ptr<const discovery::Instance> node(const char* host, proto::Role role,
                                                       proto::Connector connector = proto::Connector::kNixl,
                                                       proto::Labels labels = {}, std::string model = {}) {
  auto i = std::make_shared<discovery::Instance>();
  i->http_address = proto::HostPort{host, 8000};
  i->key = i->http_address.to_string();
  i->role = role;
  i->connector = connector;
  i->labels = std::move(labels);
  i->model = std::move(model);
  return i;
}

}  // namespace pdr::test
