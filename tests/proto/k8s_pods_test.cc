#include "proto/k8s_pods.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

const char* kPod = R"({"kind":"Pod","apiVersion":"v1","metadata":{"name":"decode-0","namespace":"llm",
  "uid":"u-1","resourceVersion":"42","labels":{"app":"vllm","pdrouter.io/role":"decode"},
  "annotations":{"pdrouter.io/port":"8100"},"ownerReferences":[{"kind":"ReplicaSet"}]},
  "spec":{"containers":[{"name":"vllm"}]},
  "status":{"phase":"Running","podIP":"127.0.0.3","conditions":[{"type":"Initialized","status":"True"},
  {"type":"Ready","status":"True"}]}})";

TEST(K8sPods, WatchEventDecodesThePodFieldsDiscoveryReads) {
  PodEvent event;
  ASSERT_TRUE(parse_pod_watch_event(std::string(R"({"type":"MODIFIED","object":)") + kPod + "}", &event));
  EXPECT_EQ(event.type, PodEventType::kModified);
  const PodInfo& pod = event.pod;
  EXPECT_EQ(pod.name, "decode-0");
  EXPECT_EQ(pod.namespace_name, "llm");
  EXPECT_EQ(pod.uid, "u-1");
  EXPECT_EQ(pod.resource_version, "42");
  EXPECT_FALSE(pod.deleting);
  ASSERT_NE(pod.label("pdrouter.io/role"), nullptr);
  EXPECT_EQ(*pod.label("pdrouter.io/role"), "decode");
  EXPECT_EQ(pod.label("missing"), nullptr);
  ASSERT_NE(pod.annotation("pdrouter.io/port"), nullptr);
  EXPECT_EQ(*pod.annotation("pdrouter.io/port"), "8100");
  EXPECT_EQ(pod.phase, "Running");
  EXPECT_EQ(pod.pod_ip, "127.0.0.3");
  EXPECT_TRUE(pod.ready);
}

TEST(K8sPods, EveryEventTypeDecodes) {
  PodEvent event;
  ASSERT_TRUE(parse_pod_watch_event(R"({"type":"ADDED","object":{"metadata":{"name":"a"}}})", &event));
  EXPECT_EQ(event.type, PodEventType::kAdded);
  EXPECT_FALSE(event.pod.ready);
  ASSERT_TRUE(parse_pod_watch_event(
      R"({"type":"DELETED","object":{"metadata":{"name":"a","deletionTimestamp":"2026-11-26T10:00:00Z"}}})", &event));
  EXPECT_EQ(event.type, PodEventType::kDeleted);
  EXPECT_TRUE(event.pod.deleting);
  ASSERT_TRUE(parse_pod_watch_event(
      R"({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12746"}}})", &event));
  EXPECT_EQ(event.type, PodEventType::kBookmark);
  EXPECT_EQ(event.pod.resource_version, "12746");
  ASSERT_TRUE(parse_pod_watch_event(R"J({"type":"ERROR","object":{"kind":"Status","status":"Failure",
      "message":"too old resource version: 1 (2)","reason":"Expired","code":410}})J", &event));
  EXPECT_EQ(event.type, PodEventType::kError);
  EXPECT_EQ(event.error_code, 410);
  EXPECT_EQ(event.error_reason, "Expired");
  EXPECT_EQ(event.error_message, "too old resource version: 1 (2)");
  EXPECT_EQ(to_string(PodEventType::kBookmark), "BOOKMARK");
}

TEST(K8sPods, NotReadyAndReadyFalseConditions) {
  PodEvent event;
  ASSERT_TRUE(parse_pod_watch_event(R"({"type":"ADDED","object":{"metadata":{"name":"a"},
      "status":{"phase":"Running","podIP":"127.0.0.2","conditions":[{"type":"Ready","status":"False"}]}}})",
                                    &event));
  EXPECT_FALSE(event.pod.ready);
  ASSERT_TRUE(parse_pod_watch_event(R"({"type":"ADDED","object":{"metadata":{"name":"a","labels":null},
      "status":{"phase":"Pending","conditions":null}}})", &event));
  EXPECT_EQ(event.pod.phase, "Pending");
  EXPECT_TRUE(event.pod.pod_ip.empty());
}

TEST(K8sPods, BadEventsAreRefusedAndLeaveTheOutputAlone) {
  PodEvent event;
  event.pod.name = "untouched";
  for (const char* bad : {
           "", "not json", "[]", R"({"object":{"metadata":{"name":"a"}}})",
           R"({"type":"EXPLODED","object":{"metadata":{"name":"a"}}})", R"({"type":"ADDED"})",
           R"({"type":"ADDED","object":{}})", R"({"type":"ADDED","object":{"metadata":{"name":7}}})",
           R"({"type":"ADDED","object":{"metadata":{"name":"a","labels":{"k":1}}}})",
           R"({"type":"ADDED","object":{"metadata":{"name":"a"},"status":{"conditions":{}}}})",
           R"({"type":"ADDED","object":{"metadata":{"name":"a"},"status":{"conditions":[1]}}})",
           R"({"type":"ERROR","object":{"code":"410"}})", R"({"type":"ERROR","object":{"code":100000}})",
           R"({"type":7,"object":{}})"}) {
    EXPECT_FALSE(parse_pod_watch_event(bad, &event)) << bad;
  }
  EXPECT_EQ(event.pod.name, "untouched");
}

TEST(K8sPods, LimitsBoundWhatIsKept) {
  PodEvent event;
  const std::string long_name(kMaxPodFieldBytes + 1, 'n');
  EXPECT_EQ(parse_pod_watch_event(R"({"type":"ADDED","object":{"metadata":{"name":")" + long_name + R"("}}})",
                                  &event)
                .code(),
            StatusCode::kTooLarge);
  // A huge annotation (kubectl's last-applied-configuration) is dropped, the pod still decodes;
  // past kMaxPodMetadataEntries labels, the rest are dropped.
  std::string labels;
  for (size_t i = 0; i < kMaxPodMetadataEntries + 10; ++i) {
    labels += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\":\"v\"";
  }
  const std::string big(kMaxPodMetadataValueBytes + 1, 'x');
  ASSERT_TRUE(parse_pod_watch_event(R"({"type":"ADDED","object":{"metadata":{"name":"a","labels":{)" + labels +
                                        R"(},"annotations":{"huge":")" + big + R"(","small":"s"}}}})",
                                    &event));
  EXPECT_EQ(event.pod.labels.size(), kMaxPodMetadataEntries);
  EXPECT_EQ(event.pod.annotation("huge"), nullptr);
  ASSERT_NE(event.pod.annotation("small"), nullptr);
  EXPECT_EQ(parse_pod_watch_event(std::string(kMaxPodWatchLineBytes + 1, ' '), &event).code(), StatusCode::kTooLarge);
  EXPECT_FALSE(parse_pod_watch_event(std::string(100000, '['), &event));
}

TEST(K8sPods, ListCarriesItsResourceVersionAndItems) {
  PodList list;
  ASSERT_TRUE(parse_pod_list(std::string(R"({"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"77"},
      "items":[)") + kPod + "," + kPod + "]}",
                             &list));
  EXPECT_EQ(list.resource_version, "77");
  ASSERT_EQ(list.items.size(), 2u);
  EXPECT_EQ(list.items[1].pod_ip, "127.0.0.3");
  ASSERT_TRUE(parse_pod_list(R"({"kind":"PodList","metadata":{"resourceVersion":"5"},"items":null})", &list));
  EXPECT_TRUE(list.items.empty());
  list.resource_version = "untouched";
  EXPECT_FALSE(parse_pod_list(R"({"items":{}})", &list));
  EXPECT_FALSE(parse_pod_list(R"({"items":[1]})", &list));
  EXPECT_FALSE(parse_pod_list(R"({"metadata":{"resourceVersion":5}})", &list));
  EXPECT_EQ(list.resource_version, "untouched");
}

TEST(K8sPods, StatusBodyAndQueryEscaping) {
  int code = 0;
  std::string reason, message;
  ASSERT_TRUE(parse_k8s_status(R"({"kind":"Status","code":403,"reason":"Forbidden","message":"pods is forbidden"})",
                               &code, &reason, &message));
  EXPECT_EQ(code, 403);
  EXPECT_EQ(reason, "Forbidden");
  EXPECT_EQ(message, "pods is forbidden");
  EXPECT_FALSE(parse_k8s_status("<html>", &code, &reason, &message));
  EXPECT_EQ(url_query_escape("app=vllm,pdrouter.io/role in (prefill)"),
            "app%3Dvllm%2Cpdrouter.io%2Frole%20in%20%28prefill%29");
}

}  // namespace
}  // namespace pdr::proto
