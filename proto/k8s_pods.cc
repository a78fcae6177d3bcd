#include "proto/k8s_pods.h"

#include <simdjson.h>

namespace pdr::proto {

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

Status wrong_type(std::string_view what, std::string_view expected) {
  return Status(StatusCode::kWrongType, "kubernetes answer: '" + std::string(what) + "' is not " +
                                            std::string(expected));
}

Status parse_root(simdjson::dom::parser& parser, std::string_view json, size_t limit, object* root) {
  if (json.size() > limit) {
    return Status(StatusCode::kTooLarge, "kubernetes answer over " + std::to_string(limit) + " bytes");
  }
  element root_element;
  if (auto err = parser.parse(json.data(), json.size()).get(root_element); err != simdjson::SUCCESS) {
    return Status(StatusCode::kMalformed, std::string("kubernetes answer is not JSON: ") + simdjson::error_message(err));
  }
  if (root_element.get_object().get(*root) != simdjson::SUCCESS) return wrong_type("answer", "an object");
  return Status::ok();
}

// An optional object member; absent or null leaves *out unset and *present false.
Status get_object(object parent, std::string_view key, object* out, bool* present) {
  *present = false;
  element e;
  if (parent.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return Status::ok();
  if (e.get_object().get(*out) != simdjson::SUCCESS) return wrong_type(key, "an object");
  *present = true;
  return Status::ok();
}

// An optional string member (absent or null: ""), at most `limit` bytes.
Status get_string(object parent, std::string_view key, size_t limit, std::string* out) {
  out->clear();
  element e;
  if (parent.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return Status::ok();
  std::string_view text;
  if (e.get_string().get(text) != simdjson::SUCCESS) return wrong_type(key, "a string");
  if (text.size() > limit) {
    return Status(StatusCode::kTooLarge,
                  "kubernetes answer: '" + std::string(key) + "' over " + std::to_string(limit) + " bytes");
  }
  out->assign(text);
  return Status::ok();
}

// labels / annotations: string -> string; oversized entries and entries past the count limit
// are dropped, a value of another type is an error.
Status get_string_map(object parent, std::string_view key, PodMetadataMap* out) {
  out->clear();
  object map;
  bool present = false;
  if (Status st = get_object(parent, key, &map, &present); !st || !present) return st;
  for (auto field : map) {
    std::string_view value;
    if (field.value.get_string().get(value) != simdjson::SUCCESS) return wrong_type(key, "a map of strings");
    if (field.key.size() > kMaxPodMetadataKeyBytes || value.size() > kMaxPodMetadataValueBytes) continue;
    if (out->size() >= kMaxPodMetadataEntries) continue;
    out->emplace_back(std::string(field.key), std::string(value));
  }
  return Status::ok();
}

Status read_metadata(object pod, PodInfo* out) {
  object metadata;
  bool present = false;
  if (Status st = get_object(pod, "metadata", &metadata, &present); !st || !present) return st;
  if (Status st = get_string(metadata, "name", kMaxPodFieldBytes, &out->name); !st) return st;
  if (Status st = get_string(metadata, "namespace", kMaxPodFieldBytes, &out->namespace_name); !st) return st;
  if (Status st = get_string(metadata, "uid", kMaxPodFieldBytes, &out->uid); !st) return st;
  if (Status st = get_string(metadata, "resourceVersion", kMaxPodFieldBytes, &out->resource_version); !st) {
    return st;
  }
  std::string deletion;
  if (Status st = get_string(metadata, "deletionTimestamp", kMaxPodFieldBytes, &deletion); !st) return st;
  out->deleting = !deletion.empty();
  if (Status st = get_string_map(metadata, "labels", &out->labels); !st) return st;
  return get_string_map(metadata, "annotations", &out->annotations);
}

Status read_pod_status(object pod, PodInfo* out) {
  object status;
  bool present = false;
  if (Status st = get_object(pod, "status", &status, &present); !st || !present) return st;
  if (Status st = get_string(status, "phase", kMaxPodFieldBytes, &out->phase); !st) return st;
  if (Status st = get_string(status, "podIP", kMaxPodFieldBytes, &out->pod_ip); !st) return st;
  element conditions_element;
  if (status.at_key("conditions").get(conditions_element) != simdjson::SUCCESS || conditions_element.is_null()) {
    return Status::ok();
  }
  array conditions;
  if (conditions_element.get_array().get(conditions) != simdjson::SUCCESS) return wrong_type("conditions", "an array");
  for (element item : conditions) {
    object condition;
    if (item.get_object().get(condition) != simdjson::SUCCESS) return wrong_type("conditions[]", "an object");
    std::string type, value;
    if (Status st = get_string(condition, "type", kMaxPodFieldBytes, &type); !st) return st;
    if (Status st = get_string(condition, "status", kMaxPodFieldBytes, &value); !st) return st;
    if (type == "Ready") out->ready = value == "True";
  }
  return Status::ok();
}

Status read_pod(object pod, PodInfo* out) {
  PodInfo info;
  if (Status st = read_metadata(pod, &info); !st) return st;
  if (Status st = read_pod_status(pod, &info); !st) return st;
  *out = std::move(info);
  return Status::ok();
}

Status read_status_object(object status, int* code, std::string* reason, std::string* message) {
  int64_t value = 0;
  element e;
  if (status.at_key("code").get(e) == simdjson::SUCCESS && !e.is_null()) {
    if (e.get_int64().get(value) != simdjson::SUCCESS) return wrong_type("code", "an integer");
  }
  if (value < 0 || value > 999) return Status(StatusCode::kOutOfRange, "kubernetes answer: 'code' out of range");
  std::string r, m;
  if (Status st = get_string(status, "reason", kMaxPodFieldBytes, &r); !st) return st;
  // A message is for logs only: a long one is cut, not refused.
  element message_element;
  std::string_view text;
  if (status.at_key("message").get(message_element) == simdjson::SUCCESS &&
      message_element.get_string().get(text) == simdjson::SUCCESS) {
    m.assign(text.substr(0, kMaxPodMetadataValueBytes));
  }
  *code = static_cast<int>(value);
  *reason = std::move(r);
  *message = std::move(m);
  return Status::ok();
}

}  // namespace

const std::string* PodInfo::label(std::string_view key) const {
  for (const auto& [k, v] : labels) {
    if (k == key) return &v;
  }
  return nullptr;
}

const std::string* PodInfo::annotation(std::string_view key) const {
  for (const auto& [k, v] : annotations) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string_view to_string(PodEventType type) {
  switch (type) {
    case PodEventType::kAdded: return "ADDED";
    case PodEventType::kModified: return "MODIFIED";
    case PodEventType::kDeleted: return "DELETED";
    case PodEventType::kBookmark: return "BOOKMARK";
    case PodEventType::kError: return "ERROR";
  }
  return "?";
}

Status parse_pod_list(std::string_view json, PodList* out) {
  simdjson::dom::parser parser;
  object root;
  if (Status st = parse_root(parser, json, kMaxPodListBytes, &root); !st) return st;
  PodList list;
  object metadata;
  bool present = false;
  if (Status st = get_object(root, "metadata", &metadata, &present); !st) return st;
  if (present) {
    if (Status st = get_string(metadata, "resourceVersion", kMaxPodFieldBytes, &list.resource_version); !st) {
      return st;
    }
  }
  element items_element;
  if (root.at_key("items").get(items_element) == simdjson::SUCCESS && !items_element.is_null()) {
    array items;
    if (items_element.get_array().get(items) != simdjson::SUCCESS) return wrong_type("items", "an array");
    for (element item : items) {
      object pod_object;
      if (item.get_object().get(pod_object) != simdjson::SUCCESS) return wrong_type("items[]", "an object");
      PodInfo pod;
      if (Status st = read_pod(pod_object, &pod); !st) return st;
      list.items.push_back(std::move(pod));
    }
  }
  *out = std::move(list);
  return Status::ok();
}

Status parse_pod_watch_event(std::string_view json, PodEvent* out) {
  simdjson::dom::parser parser;
  object root;
  if (Status st = parse_root(parser, json, kMaxPodWatchLineBytes, &root); !st) return st;
  std::string type;
  if (Status st = get_string(root, "type", kMaxPodFieldBytes, &type); !st) return st;
  PodEvent event;
  if (type == "ADDED") {
    event.type = PodEventType::kAdded;
  } else if (type == "MODIFIED") {
    event.type = PodEventType::kModified;
  } else if (type == "DELETED") {
    event.type = PodEventType::kDeleted;
  } else if (type == "BOOKMARK") {
    event.type = PodEventType::kBookmark;
  } else if (type == "ERROR") {
    event.type = PodEventType::kError;
  } else {
    return Status(StatusCode::kInvalidValue, "kubernetes watch event: unknown type '" + type.substr(0, 32) + "'");
  }
  object object_value;
  bool present = false;
  if (Status st = get_object(root, "object", &object_value, &present); !st) return st;
  if (!present) return Status(StatusCode::kInvalidValue, "kubernetes watch event without an object");
  if (event.type == PodEventType::kError) {
    if (Status st = read_status_object(object_value, &event.error_code, &event.error_reason, &event.error_message);
        !st) {
      return st;
    }
  } else {
    if (Status st = read_pod(object_value, &event.pod); !st) return st;
    if (event.type != PodEventType::kBookmark && event.pod.name.empty()) {
      return Status(StatusCode::kInvalidValue, "kubernetes watch event: a pod without metadata.name");
    }
  }
  *out = std::move(event);
  return Status::ok();
}

Status parse_k8s_status(std::string_view json, int* code, std::string* reason, std::string* message) {
  simdjson::dom::parser parser;
  object root;
  if (Status st = parse_root(parser, json, kMaxPodWatchLineBytes, &root); !st) return st;
  return read_status_object(root, code, reason, message);
}

std::string url_query_escape(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

}  // namespace pdr::proto
